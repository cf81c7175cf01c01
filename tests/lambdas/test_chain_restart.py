"""chain_restart as AWS would invoke it: an EventBridge event (JSON fixture) and a context object.

The handler talks to a real API over HTTP (uvicorn in this process, real SQLite store); only the
controller is absent, so each test arranges attempts in the store directly.
"""

from __future__ import annotations

import copy
import json
import random
from pathlib import Path

import pytest

from lambdas import chain_restart
from orchestrator.events import Dispatcher, LambdaContext, Subscription
from orchestrator.settings import Settings
from orchestrator.store import repo
from tests.helpers.live_api import start_live_api

FIXTURE = Path(__file__).parent.parent / "data" / "events" / "attempt_failed.json"


@pytest.fixture
def api(aerie_home):
    live = start_live_api(Settings())
    yield live
    live.stop()


def _ctx(api) -> LambdaContext:
    return LambdaContext(function_name="chain_restart", aerie_api=api.url, aerie_token=api.service)


def _job(api, spec_extra: dict | None = None, failed: dict | None = None) -> str:
    spec = {"name": "pythia-tiny", "backend": "local", "entrypoint": ["python", "-m", "trainer.train"],
            "retry": {"max_restarts": 2, "exclude_bad_nodes": True, "non_retryable_exit_codes": [2]},
            **(spec_extra or {})}
    with api.db.session() as s:
        job = repo.create_job(s, spec, "default")
        repo.set_job_state(s, job, "InProgress")
        attempt = repo.create_attempt(s, job, 1)
        repo.set_attempt_state(s, attempt, "Running")
        repo.record_verdict(s, attempt, "algo-2", "silent.hang", "no step", {})
        repo.set_attempt_state(s, attempt, "Failed", failed or {"kind": "silent.hang", "host": "algo-2"})
        return job.id


def _event(job_id: str, attempt: int = 1, reason: dict | None = None) -> dict:
    text = FIXTURE.read_text().replace("JOB_ID", job_id)
    event = json.loads(text)
    event["detail"]["attempt"] = attempt
    event["detail"]["attempt_id"] = f"{job_id}-a{attempt}"
    if reason:
        event["detail"]["reason"] = reason
    return event


def _attempts(api, job_id):
    with api.db.session() as s:
        return [(a.number, a.resume_from, list(a.exclude_nodes or [])) for a in repo.get_job(s, "default", job_id).attempts]


def test_silent_failure_restarts_on_healthy_nodes(api):
    job_id = _job(api)
    result = chain_restart.handler(_event(job_id), _ctx(api))
    assert result["action"] == "restart" and result["attempt"] == 2
    assert _attempts(api, job_id) == [(1, None, []), (2, None, ["algo-2"])]


def test_same_event_three_times_creates_one_attempt(api):
    job_id = _job(api)
    event = _event(job_id)
    results = [chain_restart.handler(copy.deepcopy(event), _ctx(api)) for _ in range(3)]
    assert [r["action"] for r in results] == ["restart", "none", "none"]
    assert len(_attempts(api, job_id)) == 2


def test_stale_event_for_an_older_attempt_does_nothing(api):
    job_id = _job(api)
    chain_restart.handler(_event(job_id), _ctx(api))
    with api.db.session() as s:
        a2 = repo.get_job(s, "default", job_id).attempts[1]
        repo.set_attempt_state(s, a2, "Failed", {"kind": "loss.nan"})
    # attempt 1's failure delivered again after attempt 2 failed: only attempt 2's counts.
    assert chain_restart.handler(_event(job_id, 1), _ctx(api))["action"] == "none"
    assert chain_restart.handler(_event(job_id, 2, {"kind": "loss.nan"}), _ctx(api))["attempt"] == 3


def test_user_error_and_non_retryable_exit_end_the_job(api):
    job_id = _job(api, failed={"kind": "exit.nonzero", "exit_code": 2, "message": "bad flag"})
    result = chain_restart.handler(_event(job_id, reason={"kind": "exit.nonzero", "exit_code": 2}), _ctx(api))
    assert result["action"] == "fail"
    with api.db.session() as s:
        job = repo.get_job(s, "default", job_id)
        assert job.state == "Failed" and len(job.attempts) == 1
        assert "non-retryable" in job.reason["message"]
    job_id = _job(api, failed={"kind": "user.error", "message": "bad hyperparameter lr=-1"})
    assert chain_restart.handler(_event(job_id), _ctx(api))["action"] == "fail"


def test_exhausted_budget_fails_the_job_with_the_last_cause(api):
    job_id = _job(api, {"retry": {"max_restarts": 1}})
    assert chain_restart.handler(_event(job_id), _ctx(api))["action"] == "restart"
    with api.db.session() as s:
        a2 = repo.get_job(s, "default", job_id).attempts[1]
        repo.set_attempt_state(s, a2, "Failed", {"kind": "node.lost", "host": "algo-1"})
    result = chain_restart.handler(_event(job_id, 2, {"kind": "node.lost"}), _ctx(api))
    assert result["action"] == "fail"
    with api.db.session() as s:
        job = repo.get_job(s, "default", job_id)
        assert job.state == "Failed" and job.reason["kind"] == "node.lost" and job.reason["retry_exhausted"]


def test_redelivered_out_of_order_through_the_dispatcher_yields_one_attempt_per_failure(api):
    """Every event delivered 3 times, shuffled, through the real outbox dispatcher."""
    job_id = _job(api)
    with api.db.session() as s:
        events = [repo.eventbridge(e) for e in repo.list_events(s, repo.get_job(s, "default", job_id))]
    deliveries = events * 3
    random.Random(7).shuffle(deliveries)
    ctx = _ctx(api)
    for event in deliveries:
        chain_restart.handler(copy.deepcopy(event), ctx)
    assert [n for n, *_ in _attempts(api, job_id)] == [1, 2]

    # And the dispatcher itself: pending events reach the handler, then are marked delivered.
    dispatcher = Dispatcher(api.db, [Subscription("chain_restart", frozenset({repo.ATTEMPT_STATE_CHANGE}),
                                                  chain_restart.handler)], api_url=api.url, token=api.service)
    dispatcher.deliver_once()
    with api.db.session() as s:
        statuses = {e.status for e in repo.list_events(s, repo.get_job(s, "default", job_id))}
    assert statuses == {"delivered"}
    assert [n for n, *_ in _attempts(api, job_id)] == [1, 2]
