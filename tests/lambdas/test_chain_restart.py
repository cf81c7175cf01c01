"""chain_restart as AWS would invoke it: an EventBridge event (JSON fixture) and a context object.

The handler talks to a real API over HTTP (uvicorn in this process, real SQLite store); only the
controller is absent, so each test arranges attempts in the store directly.
"""

from __future__ import annotations

import copy
import json
import random
from pathlib import Path

import httpx

from aerie_contracts import DetailType
from lambdas import chain_restart
from orchestrator.events import LambdaContext
from orchestrator.store import repo

FIXTURE = Path(__file__).parent.parent / "data" / "events" / "attempt_failed.json"


def _ctx(api) -> LambdaContext:
    return api.context("chain_restart")


def _job(api, spec_extra: dict | None = None, failed: dict | None = None) -> str:
    spec = {
        "name": "pythia-tiny",
        "backend": "local",
        "entrypoint": ["python", "-m", "trainer.train"],
        "retry": {"max_restarts": 2, "exclude_bad_nodes": True, "non_retryable_exit_codes": [2]},
        **(spec_extra or {}),
    }
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
        return [
            (a.number, a.resume_from, list(a.exclude_nodes or [])) for a in repo.get_job(s, "default", job_id).attempts
        ]


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


def test_an_input_channel_that_cannot_arrive_is_not_retried(api):
    reason = {
        "kind": "input.unavailable",
        "host": "algo-1",
        "channel": "train",
        "prefix": "s3://data/missing/",
        "message": "input channel 'train' (s3://data/missing/, File mode): no objects under the prefix",
    }
    job_id = _job(api, failed=reason)
    result = chain_restart.handler(_event(job_id, reason=reason), _ctx(api))
    assert result["action"] == "fail"
    with api.db.session() as s:
        job = repo.get_job(s, "default", job_id)
        assert job.state == "Failed" and len(job.attempts) == 1
        assert job.reason["kind"] == "input.unavailable" and job.reason["channel"] == "train"
        assert "not retried: the job's input or code is wrong (input.unavailable)" in job.reason["message"]
        assert "s3://data/missing/" in job.reason["message"]


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
    dispatcher = api.dispatcher("chain_restart", DetailType.ATTEMPT_STATE_CHANGE, chain_restart.handler)
    dispatcher.deliver_once()
    with api.db.session() as s:
        statuses = {e.status for e in repo.list_events(s, repo.get_job(s, "default", job_id))}
    assert statuses == {"delivered"}
    assert [n for n, *_ in _attempts(api, job_id)] == [1, 2]


# --- blame and exclusion -------------------------------------------------------------------------

BLAME_DATA = Path(__file__).parent.parent / "data" / "blame"


def _recorded_failure(api, name: str, retry: dict | None = None, backend: str = "local") -> str:
    """A job whose attempt 1 failed as a recorded real run did (tests/data/blame/): the nodes' last
    heartbeats and every verdict with its evidence, stored through the repo as the API would."""
    recorded = json.loads((BLAME_DATA / f"{name}.json").read_text())
    failed = recorded["failed"]
    spec = {
        "name": "blame",
        "backend": backend,
        "entrypoint": ["python", "-m", "trainer.train"],
        "retry": {"max_restarts": 3, **(retry or {})},
    }
    with api.db.session() as s:
        job = repo.create_job(s, spec, "default")
        repo.set_job_state(s, job, "InProgress")
        attempt = repo.create_attempt(s, job, 1)
        repo.set_attempt_state(s, attempt, "Running")
        for node in failed["nodes"]:
            row = repo.record_heartbeat(s, attempt, node["host"], node["summary"])
            row.last_heartbeat_at = node["last_heartbeat_at"]
        for v in recorded["job"]["verdicts"]:
            repo.record_verdict(s, attempt, v["host"], v["kind"], v["message"], v["evidence"]).t = v["t"]
        repo.set_attempt_state(s, attempt, "Failed", failed["reason"])
        return job.id


def _fail_latest(api, job_id: str, reason: dict, verdict_hosts: tuple[str, ...] = ()) -> int:
    """Fail the job's latest attempt (after the handler created it) with `reason`."""
    with api.db.session() as s:
        attempt = repo.get_job(s, "default", job_id).attempts[-1]
        repo.set_attempt_state(s, attempt, "Running")
        for host in verdict_hosts:
            repo.record_verdict(s, attempt, host, reason["kind"], reason.get("message", ""), {})
        repo.set_attempt_state(s, attempt, "Failed", reason)
        return attempt.number


def _blames(api, job_id: str) -> list[tuple[int, str, str]]:
    job = httpx.get(f"{api.url}/v1/jobs/{job_id}", headers={"Authorization": f"Bearer {api.admin}"}).json()
    numbers = {a["id"]: a["number"] for a in job["attempt_list"]}
    return [(numbers[b["attempt_id"]], b["host"], b["rule"]) for b in job["blames"] if b["cleared_at"] is None]


def test_hang_blames_the_node_the_evidence_names_and_only_it_is_excluded(api):
    """The recorded busy hang: both nodes raised silent.hang, algo-2 (its rank spinning) is blamed."""
    job_id = _recorded_failure(api, "busy_hang_rank3")
    result = chain_restart.handler(_event(job_id, reason={"kind": "silent.hang"}), _ctx(api))
    assert result["action"] == "restart" and result["exclude_nodes"] == ["algo-2"]
    assert _blames(api, job_id) == [(1, "algo-2", "not_waiting")]
    assert _attempts(api, job_id)[1] == (2, None, ["algo-2"])
    # A redelivery records nothing twice.
    assert chain_restart.handler(_event(job_id, reason={"kind": "silent.hang"}), _ctx(api))["action"] == "none"
    assert _blames(api, job_id) == [(1, "algo-2", "not_waiting")]


def test_nan_blames_no_node_and_excludes_nothing(api):
    job_id = _job(api, failed={"kind": "loss.nan", "host": "algo-1", "message": "nan at step 12"})
    with api.db.session() as s:
        attempt = repo.get_job(s, "default", job_id).attempts[0]
        repo.record_verdict(s, attempt, "algo-1", "loss.nan", "nan", {})
    result = chain_restart.handler(_event(job_id, reason={"kind": "loss.nan"}), _ctx(api))
    assert result["action"] == "restart" and result["exclude_nodes"] == []
    assert _blames(api, job_id) == []
    # One NaN after another on a small cluster: still nobody excluded.
    _fail_latest(api, job_id, {"kind": "loss.nan", "host": "algo-2"}, ("algo-1", "algo-2"))
    assert chain_restart.handler(_event(job_id, 2, {"kind": "loss.nan"}), _ctx(api))["exclude_nodes"] == []


def test_a_nan_that_recurs_at_the_same_step_after_resume_ends_the_job_as_a_user_error(api):
    """Issue #19, acceptance 4: attempt 1's NaN at step 12 is replayed by attempt 2 (a
    deterministic resume) and recurs at step 12: the data's or the model's, so no third attempt."""
    nan = {"kind": "loss.nan", "host": "algo-2", "message": "nan at step 12"}
    evidence = {"step": 12, "rank": "3", "origin_ranks": ["3"], "consumed_samples": 96}
    job_id = _job(api, failed=nan)
    with api.db.session() as s:
        repo.record_verdict(s, repo.get_job(s, "default", job_id).attempts[0], "algo-2", "loss.nan", "nan", evidence)
    assert chain_restart.handler(_event(job_id, reason=nan), _ctx(api))["action"] == "restart"
    with api.db.session() as s:
        second = repo.get_job(s, "default", job_id).attempts[-1]
        repo.set_attempt_state(s, second, "Running")
        repo.record_verdict(s, second, "algo-2", "loss.nan", "nan", evidence)
        repo.set_attempt_state(s, second, "Failed", nan)
    result = chain_restart.handler(_event(job_id, 2, nan), _ctx(api))
    assert result["action"] == "fail"
    job = httpx.get(f"{api.url}/v1/jobs/{job_id}", headers={"Authorization": f"Bearer {api.admin}"}).json()
    assert job["state"] == "Failed" and len(job["attempt_list"]) == 2
    why = job["reason"]
    assert why["kind"] == "user.error" and why["step"] == 12 and why["data_index"] == [88, 96]
    assert "recurs at step 12" in why["message"] and "samples [88, 96)" in why["message"]


def test_a_node_is_excluded_after_exclude_after_blames_blames_until_they_are_cleared(api):
    job_id = _recorded_failure(api, "sigstop_rank1", retry={"exclude_after_blames": 2})
    first = chain_restart.handler(_event(job_id, reason={"kind": "silent.hang"}), _ctx(api))
    assert first["exclude_nodes"] == [] and _blames(api, job_id) == [(1, "algo-1", "stopped_rank")]
    _fail_latest(api, job_id, {"kind": "node.lost", "host": "algo-1", "message": "no heartbeat"}, ("algo-1",))
    second = chain_restart.handler(_event(job_id, 2, {"kind": "node.lost"}), _ctx(api))
    assert second["exclude_nodes"] == ["algo-1"]  # blamed twice
    # The node passes its pre-launch health check (issue #23 records it so): its blame stops counting.
    with api.db.session() as s:
        assert repo.clear_blames(s, repo.get_job(s, "default", job_id), "algo-1", by="preflight:test") == 2
    _fail_latest(api, job_id, {"kind": "exit.nonzero", "host": "algo-2", "exit_code": 1})
    third = chain_restart.handler(_event(job_id, 3, {"kind": "exit.nonzero"}), _ctx(api))
    assert third["exclude_nodes"] == [] and _blames(api, job_id) == []


def test_exclusion_off_or_on_sagemaker_still_records_the_blame(api):
    for retry, backend in (({"exclude_bad_nodes": False}, "local"), ({}, "sagemaker")):
        job_id = _recorded_failure(api, "busy_hang_rank3", retry=retry, backend=backend)
        result = chain_restart.handler(_event(job_id, reason={"kind": "silent.hang"}), _ctx(api))
        # SageMaker provisions every attempt's instances itself: algo-N names positions, not machines.
        assert result["action"] == "restart" and result["exclude_nodes"] == [], backend
        assert _blames(api, job_id) == [(1, "algo-2", "not_waiting")]
        # In place, though, the blamed node is the same machine: SageMaker relaunches (a new
        # training job); with exclusion off it does not count.
        assert result["mode"] == ("relaunch" if backend == "sagemaker" else "in_place"), (backend, result)


def test_retry_follows_the_policy_table(api):
    for reason, action in (
        ({"kind": "placement.failed", "message": "cannot place 2 node(s)"}, "fail"),
        ({"kind": "silent.made_up"}, "fail"),  # unknown kinds are not retried: a typo fails loudly
        ({"kind": "exit.nonzero", "exit_code": 2, "signal": 9}, "restart"),  # a signal, not the code's verdict
        ({"kind": "checkpoint.stalled", "host": "algo-2"}, "restart"),
    ):
        job_id = _job(api, failed=reason)
        result = chain_restart.handler(_event(job_id, reason=reason), _ctx(api))
        assert result["action"] == action, (reason, result)


def _with_nodes(api, job_id: str, hosts: tuple[str, ...] = ("algo-1", "algo-2")) -> None:
    with api.db.session() as s:
        attempt = repo.get_job(s, "default", job_id).attempts[-1]
        for host in hosts:
            repo.record_heartbeat(s, attempt, host, {"t": 1.0})


def _causes(api, job_id):
    with api.db.session() as s:
        return [a.cause for a in repo.get_job(s, "default", job_id).attempts[1:]]


def test_the_decision_records_its_mode_and_reason_once_however_often_the_event_comes(api):
    """A rank crash on healthy nodes: in place, recorded in the new attempt's cause (what the API
    and `aerie describe` show); the same event three times still makes one attempt."""
    job_id = _job(api, failed={"kind": "exit.nonzero", "exit_code": 1, "host": "algo-2"})
    _with_nodes(api, job_id)
    event = _event(job_id, reason={"kind": "exit.nonzero", "exit_code": 1})
    results = [chain_restart.handler(copy.deepcopy(event), _ctx(api)) for _ in range(3)]
    assert [r["action"] for r in results] == ["restart", "none", "none"]
    assert results[0]["mode"] == "in_place" and "exit.nonzero on healthy nodes" in results[0]["mode_reason"]
    [cause] = _causes(api, job_id)
    assert cause["mode"] == "in_place" and cause["mode_reason"] == results[0]["mode_reason"]
    shown = httpx.get(
        f"{api.url}/v1/jobs/{job_id}", headers={"Authorization": f"Bearer {api.admin}"}, timeout=10
    ).json()
    assert shown["attempt_list"][1]["cause"]["mode"] == "in_place"


def test_a_blamed_and_excluded_node_or_a_lost_one_falls_back_to_a_relaunch(api):
    # The recorded busy hang blames algo-2, excluded after one blame (the default).
    job_id = _recorded_failure(api, "busy_hang_rank3")
    result = chain_restart.handler(_event(job_id, reason={"kind": "silent.hang"}), _ctx(api))
    assert result["mode"] == "relaunch" and "algo-2 excluded" in result["mode_reason"], result
    # Excluded only at the second blame: the first restarts in place, on the blamed node too.
    job_id = _recorded_failure(api, "busy_hang_rank3", retry={"exclude_after_blames": 2})
    result = chain_restart.handler(_event(job_id, reason={"kind": "silent.hang"}), _ctx(api))
    assert result["mode"] == "in_place" and result["exclude_nodes"] == [], result
    lost = {"kind": "node.lost", "host": "algo-1", "message": "no heartbeat"}
    job_id = _job(api, failed=lost)
    _with_nodes(api, job_id)
    result = chain_restart.handler(_event(job_id, reason=lost), _ctx(api))
    assert result["mode"] == "relaunch" and "node.lost" in result["mode_reason"], result
    assert _causes(api, job_id)[0]["mode"] == "relaunch"
