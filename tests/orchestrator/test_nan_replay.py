"""NaN attribution by replay, the part the controller decides (issue #19, acceptance 4): attempt 1
failed with a NaN produced by rank 3 on algo-2; attempt 2 replays the step and passes it with a
finite loss, so the first NaN is `sdc.suspect` against algo-2, which is blamed (later attempts
leave it out); attempt 2 runs on. The recurring case is chaining's: tests/lambdas/test_chain_restart.py."""

from __future__ import annotations

import time

from orchestrator.backends.base import NodeStatus, PollResult
from orchestrator.controller import Controller
from orchestrator.settings import Settings
from orchestrator.store import Database, repo
from recovery.nan_replay import first_nan, recurred, samples_of
from tests.orchestrator.test_straggler import Running

NAN = {"step": 12, "rank": "3", "origin_ranks": ["3"], "consumed_samples": 96}


def test_first_nan_names_the_node_whose_rank_produced_it():
    verdicts = [
        {"attempt_id": "a1", "kind": "loss.nan", "host": "algo-1", "evidence": {**NAN, "origin_ranks": []}},
        {"attempt_id": "a1", "kind": "loss.nan", "host": "algo-2", "evidence": NAN},
        {"attempt_id": "a1", "kind": "loss.nan", "host": "algo-2", "evidence": {**NAN, "step": 13}},
    ]
    assert first_nan(verdicts, "a1") == {"step": 12, "host": "algo-2", "rank": "3", "consumed_samples": 96}
    assert first_nan(verdicts, "a2") is None
    assert samples_of(12, 96) == [88, 96] and samples_of(12, None) is None


def test_a_nan_at_another_step_is_no_recurrence():
    job = {
        "attempt_list": [
            {"id": "a1", "number": 1, "reason": {"kind": "loss.nan"}},
            {"id": "a2", "number": 2, "reason": {"kind": "loss.nan"}},
        ],
        "verdicts": [
            {"attempt_id": "a1", "kind": "loss.nan", "host": "algo-2", "evidence": NAN},
            {"attempt_id": "a2", "kind": "loss.nan", "host": "algo-2", "evidence": {**NAN, "step": 30}},
        ],
    }
    assert recurred(job, job["attempt_list"][1]) is None
    job["verdicts"][1]["evidence"]["step"] = 12
    assert recurred(job, job["attempt_list"][1])["kind"] == "user.error"


def _replaying(db: Database, last_steps: dict[str, int]) -> tuple[str, str]:
    """Attempt 1 failed with rank 3's NaN at step 12 on algo-2; attempt 2 replays it, its nodes
    last reported at `last_steps`. (first id, second id)"""
    with db.session() as s:
        job = repo.create_job(s, {"name": "j", "backend": "local"}, "default")
        repo.set_job_state(s, job, "InProgress")
        first = repo.create_attempt(s, job, 1)
        repo.set_attempt_state(s, first, "Running")
        repo.record_verdict(s, first, "algo-2", "loss.nan", "rank 3 nan at step 12", NAN)
        repo.set_attempt_state(s, first, "Failed", {"kind": "loss.nan", "host": "algo-2"})
        second = repo.create_attempt(s, job, 2)
        second.cause = {"failed_attempt": 1, "reason": {"kind": "loss.nan"}}
        repo.set_attempt_state(s, second, "Running")
        second.handle = {"root": "/nowhere", "hosts": ["algo-1", "algo-2"]}
        for host, last in last_steps.items():
            repo.record_heartbeat(s, second, host, {"t": time.time(), "last_step": last, "last_loss": 4.2})
        return first.id, second.id


def test_a_nan_that_does_not_recur_is_sdc_suspect_and_blames_its_node(aerie_home):
    db = Database(Settings().db_url)
    first_id, second_id = _replaying(db, {"algo-1": 14, "algo-2": 11})  # algo-2 has not replayed step 12 yet
    controller = Controller(db, Settings(), {"local": Running()})
    controller.reconcile_once()
    with db.session() as s:
        assert [v.kind for v in repo.verdicts_of(s, [first_id])] == ["loss.nan"]  # not decided yet
        repo.record_heartbeat(
            s, repo.get_attempt(s, second_id), "algo-2", {"t": time.time(), "last_step": 13, "last_loss": 4.1}
        )
    controller.reconcile_once()
    controller.reconcile_once()  # decided once
    with db.session() as s:
        verdicts = [(v.kind, v.host) for v in repo.verdicts_of(s, [first_id])]
        assert verdicts == [("loss.nan", "algo-2"), ("sdc.suspect", "algo-2")]
        job = repo.get_attempt(s, first_id).job
        blames = [(b.attempt_id, b.host, b.kind, b.rule) for b in repo.blames_of(s, job)]
        assert blames == [(first_id, "algo-2", "sdc.suspect", "reported")]
        assert repo.get_attempt(s, second_id).state == "Running"
    db.dispose()


class Completes(Running):
    def poll(self, handle):
        return PollResult("Completed", (NodeStatus("algo-1", "Completed"), NodeStatus("algo-2", "Completed")))


def test_a_replay_that_completes_between_heartbeats_is_judged_too(aerie_home):
    """The replaying attempt ran to its end before any node reported a step past the NaN's: it
    trained that step with no loss.nan all the same, so the first NaN is still sdc.suspect."""
    db = Database(Settings().db_url)
    first_id, second_id = _replaying(db, {"algo-1": 11, "algo-2": 11})
    Controller(db, Settings(), {"local": Completes()}).reconcile_once()
    with db.session() as s:
        assert repo.get_attempt(s, second_id).state == "Completed"
        verdicts = [(v.kind, v.host) for v in repo.verdicts_of(s, [first_id])]
        assert verdicts == [("loss.nan", "algo-2"), ("sdc.suspect", "algo-2")]
    db.dispose()
