"""Checkpoint records on SQLite and the real PostgreSQL: a commit is recorded only while its attempt
is the job's current one, with no gap between that check and the insert (two real transactions
racing), and a record's state only moves good -> bad -> deleted."""

from __future__ import annotations

import threading
import time

import pytest

from orchestrator.store import repo

HOLD_S = 0.6


def _running_attempt(db) -> str:
    with db.session() as s:
        job = repo.create_job(s, {"name": "j", "backend": "local"}, "default")
        attempt = repo.create_attempt(s, job, 1)
        repo.set_attempt_state(s, attempt, "Running")
        return attempt.id


def _race(db, attempt_id: str, first: str) -> dict:
    """Two transactions: `record` (a checkpoint of the attempt) and `fail` (the controller ending the
    attempt). `first` does its write, then holds its transaction open HOLD_S before committing;
    the other starts meanwhile. Returns what each saw and when each committed."""
    started, out = threading.Event(), {}

    def record() -> None:
        try:
            with db.session() as s:
                repo.record_checkpoint(
                    s, repo.get_attempt(s, attempt_id), 10, "s3://b/j/step_00000010/attempt_0001", {}
                )
                if first == "record":
                    started.set()
                    time.sleep(HOLD_S)
            out["record"] = "recorded"
        except repo.Superseded:
            out["record"] = "refused"
        out["record_at"] = time.monotonic()

    def fail() -> None:
        with db.session() as s:
            repo.set_attempt_state(s, repo.get_attempt(s, attempt_id), "Failed", {"kind": "node.lost"})
            if first == "fail":
                started.set()
                time.sleep(HOLD_S)
        out["fail_at"] = time.monotonic()

    runs = {"record": record, "fail": fail}
    leader = threading.Thread(target=runs[first])
    follower = threading.Thread(target=runs["fail" if first == "record" else "record"])
    leader.start()
    assert started.wait(10)
    follower.start()
    leader.join(30)
    follower.join(30)
    return out


def test_a_commit_recorded_first_holds_the_attempt_until_it_is_durable(db):
    attempt_id = _running_attempt(db)
    out = _race(db, attempt_id, first="record")
    assert out["record"] == "recorded"
    assert out["fail_at"] >= out["record_at"]  # the controller waited for the record to commit
    with db.session() as s:
        attempt = repo.get_attempt(s, attempt_id)
        assert attempt.state == "Failed"
        assert [(c.step, c.state) for c in repo.list_checkpoints(s, attempt.job)] == [(10, "good")]


def test_a_commit_racing_the_end_of_its_attempt_is_refused(db):
    attempt_id = _running_attempt(db)
    out = _race(db, attempt_id, first="fail")
    assert out["record"] == "refused"
    with db.session() as s:
        assert repo.list_checkpoints(s, repo.get_attempt(s, attempt_id).job) == []


def test_an_older_attempt_is_superseded_even_before_it_is_marked_ended(db):
    """Whatever the old attempt's state says, a newer attempt of the job supersedes it."""
    attempt_id = _running_attempt(db)
    with db.session() as s:
        old = repo.get_attempt(s, attempt_id)
        repo.create_attempt(s, old.job, 2)
    with pytest.raises(repo.Superseded), db.session() as s:
        repo.record_checkpoint(s, repo.get_attempt(s, attempt_id), 10, "s3://b/j/step_00000010/attempt_0001", {})


def test_a_save_abandoned_by_a_checkpoint_stalled_verdict_is_never_recorded(db):
    """Issue #19: the agent gave up on the upload (checkpoint.stalled); if the commit arrives after
    all, it does not become good (nor last_good)."""
    attempt_id = _running_attempt(db)
    uri = "s3://b/j/step_00000020/attempt_0001"
    with db.session() as s:
        attempt = repo.get_attempt(s, attempt_id)
        assert repo.record_checkpoint(s, attempt, 10, "s3://b/j/step_00000010/attempt_0001", {}) is not None
        repo.record_verdict(s, attempt, "algo-1", "checkpoint.stalled", "upload open for 130s", {})
    with pytest.raises(repo.Superseded, match="abandoned"), db.session() as s:
        repo.record_checkpoint(s, repo.get_attempt(s, attempt_id), 20, uri, {})
    with db.session() as s:
        assert [c.step for c in repo.list_checkpoints(s, repo.get_attempt(s, attempt_id).job)] == [10]


def test_a_record_only_moves_good_to_bad_to_deleted(db):
    attempt_id = _running_attempt(db)
    uris = [f"s3://b/j/step_{n:08d}/attempt_0001" for n in (10, 20, 30)]
    with db.session() as s:
        attempt = repo.get_attempt(s, attempt_id)
        for n, uri in zip((10, 20, 30), uris, strict=True):
            row = repo.record_checkpoint(s, attempt, n, uri, {"size_bytes": n * 1000})
            assert row is not None and row.size_bytes == n * 1000 and row.state == "good"
        assert repo.record_checkpoint(s, attempt, 10, uris[0], {}) is None  # reported twice
        job = attempt.job
        assert [c.uri for c in repo.set_checkpoint_state(s, job, [uris[0], "s3://b/unknown"], "bad", "x")] == [uris[0]]
        assert repo.set_checkpoint_state(s, job, [uris[0]], "bad", "again") == []  # no change, reason kept
        assert len(repo.set_checkpoint_state(s, job, uris[:2], "deleted", "gc")) == 2  # bad -> deleted too
        assert repo.set_checkpoint_state(s, job, uris[:2], "bad", "late") == []  # deleted is final
        rows = {c.uri: (c.state, c.reason, c.state_at is not None) for c in repo.list_checkpoints(s, job)}
    assert rows == {
        uris[0]: ("deleted", "gc", True),
        uris[1]: ("deleted", "gc", True),
        uris[2]: ("good", None, False),
    }


def test_a_memory_checkpoint_is_good_once_the_nodes_reports_cover_every_rank(db):
    """The memory tier (issue #22): each node reports its ranks once both copies are complete
    (agent.memckpt.ring.report_body); the row is `incomplete` until every rank is covered, then
    `good`, with its tier. An S3 checkpoint keeps tier `s3`; a tier that contradicts its URI, or a
    memory report without its ranks, is refused."""
    from aerie_contracts.checkpoints import memory_uri
    from agent.memckpt.ring import Replicated, report_body

    attempt_id = _running_attempt(db)
    with db.session() as s:
        attempt = repo.get_attempt(s, attempt_id)
        job_id = attempt.job_id
        repo.record_checkpoint(s, attempt, 10, "s3://b/j/step_00000010/attempt_0001", {})
    uri = memory_uri(job_id, 12, 1)
    node_a = report_body(Replicated(12, [0, 1], 100), job=job_id, attempt=1, node="a", world_size=4, peer_node="b")
    node_b = report_body(Replicated(12, [2, 3], 120), job=job_id, attempt=1, node="b", world_size=4, peer_node="a")
    with db.session() as s:
        attempt = repo.get_attempt(s, attempt_id)
        assert repo.record_checkpoint(s, attempt, 12, uri, node_a["meta"], tier=node_a["tier"]) is None
    with db.session() as s:
        rows = {c.step: (c.state, c.tier) for c in repo.list_checkpoints(s, repo.get_attempt(s, attempt_id).job)}
        assert rows == {10: ("good", "s3"), 12: ("incomplete", "memory")}
    with db.session() as s:
        attempt = repo.get_attempt(s, attempt_id)
        assert repo.record_checkpoint(s, attempt, 12, uri, node_b["meta"], tier=node_b["tier"]) is not None
        assert repo.record_checkpoint(s, attempt, 12, uri, node_b["meta"], tier="memory") is None  # re-sent
    with db.session() as s:
        (row,) = [c for c in repo.list_checkpoints(s, repo.get_attempt(s, attempt_id).job) if c.step == 12]
        assert (row.state, row.tier, row.size_bytes, row.meta["ranks"]) == ("good", "memory", 220, [0, 1, 2, 3])
    with pytest.raises(ValueError, match="does not match"), db.session() as s:
        repo.record_checkpoint(s, repo.get_attempt(s, attempt_id), 14, uri.replace("12", "14"), {}, tier="s3")
    with pytest.raises(ValueError, match="ranks"), db.session() as s:
        repo.record_checkpoint(s, repo.get_attempt(s, attempt_id), 14, memory_uri(job_id, 14, 1), {"world_size": 2})


def test_the_agents_report_of_a_commit_adds_its_timings(db):
    """The trainer's own commit records the checkpoint without timings; the agent's report of the
    same `checkpoint_committed` line, which follows, brings them (for the goodput ledger)."""
    attempt_id = _running_attempt(db)
    uri = "s3://b/j/step_00000010/attempt_0001"
    with db.session() as s:
        attempt = repo.get_attempt(s, attempt_id)
        assert repo.record_checkpoint(s, attempt, 10, uri, {"size_bytes": 5}) is not None
        line = {"event": "checkpoint_committed", "step": 10, "uri": uri, "save_s": 2.5, "size_bytes": 5}
        assert repo.record_checkpoint(s, attempt, 10, uri, line) is None  # known already
        assert repo.record_checkpoint(s, attempt, 10, uri, {"save_s": 9.0}) is None  # a re-sent line
        [ckpt] = repo.list_checkpoints(s, attempt.job)
        assert ckpt.meta == {"size_bytes": 5, "save_s": 2.5}


def test_memory_checkpoints_expire_as_newer_ones_become_good_and_with_the_job(db):
    """The store marks a memory checkpoint `deleted` with its reason once no restart can use it: a
    newer memory checkpoint became good (the agents dropped the older snapshots), a newer S3
    checkpoint was committed, its attempt ended while it was incomplete, or the job ended."""
    from aerie_contracts.checkpoints import memory_uri

    attempt_id = _running_attempt(db)

    def report(step: int, ranks: list[int], attempt: str = attempt_id) -> None:
        with db.session() as s:
            a = repo.get_attempt(s, attempt)
            meta = {"ranks": ranks, "world_size": 2, "node": "a", "size_bytes": 1}
            repo.record_checkpoint(s, a, step, memory_uri(a.job_id, step, a.number), meta, tier="memory")

    def states() -> dict[tuple[str, int], tuple[str, str | None]]:
        with db.session() as s:
            job = repo.get_attempt(s, attempt_id).job
            return {(c.tier, c.step): (c.state, c.reason) for c in repo.list_checkpoints(s, job)}

    report(4, [0, 1])
    report(8, [0])  # incomplete: step 4 stays the newest good
    assert states()[("memory", 4)] == ("good", None)
    report(8, [1])
    assert states()[("memory", 4)] == ("deleted", "replaced by the memory checkpoint of step 8")
    report(12, [0])  # incomplete when its attempt ends
    with db.session() as s:
        a1 = repo.get_attempt(s, attempt_id)
        repo.record_checkpoint(s, a1, 10, "s3://b/j/step_00000010/attempt_0001", {})
    assert states()[("memory", 8)] == ("deleted", "older than the durable (S3) checkpoint of step 10")
    assert states()[("memory", 12)] == ("incomplete", None)
    with db.session() as s:
        a1 = repo.get_attempt(s, attempt_id)
        repo.set_attempt_state(s, a1, "Failed", {"kind": "silent.hang"})
        a2 = repo.create_attempt(s, a1.job, 2)
        repo.set_attempt_state(s, a2, "Running")
        a2_id = a2.id
    report(16, [0, 1], a2_id)
    assert states()[("memory", 12)][0] == "deleted"
    assert states()[("memory", 16)] == ("good", None)  # the newest: what an in-place restart takes
    with db.session() as s:
        job = repo.get_attempt(s, attempt_id).job
        repo.set_job_state(s, job, "Failed", {"kind": "silent.hang"})
    assert states()[("memory", 16)] == ("deleted", "the job ended: its nodes removed their shared-memory areas")
    assert states()[("s3", 10)] == ("good", None)  # the durable tier is GC's, never the job's end's
