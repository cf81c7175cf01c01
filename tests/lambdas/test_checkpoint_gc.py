"""checkpoint_gc as AWS would invoke it (EventBridge fixture + context), on the real loopback S3
server and a real API over HTTP: keeps `keep_last`, the newest good one, and any resume point."""

from __future__ import annotations

import json
from pathlib import Path

from aerie_checkpoint.manifest import checkpoint_uri, list_checkpoints
from lambdas import checkpoint_gc
from orchestrator.store import repo
from tests.helpers.gc_jobs import gc_job, s3_checkpoint

FIXTURE = Path(__file__).parent.parent / "data" / "events" / "checkpoint_committed.json"


def _checkpoint(uri: str, step: int, attempt: int) -> None:
    """Sizes and token counts that tell the steps apart."""
    s3_checkpoint(uri, step, attempt, 100 + step, tokens=step * 1000)


def _commit(s, attempt, prefix: str, number: int, steps, recorded_size=None) -> None:
    """Attempt `number`'s checkpoints of `steps` in S3 and in the store (recorded as
    `recorded_size` bytes, or as large as the S3 one)."""
    for step in steps:
        _checkpoint(checkpoint_uri(prefix, step, number), step, number)
        size = 100 + step if recorded_size is None else recorded_size
        repo.record_checkpoint(s, attempt, step, checkpoint_uri(prefix, step, number), {"size_bytes": size})


def _first_attempt(s, bucket: str, name: str, keep_last: int):
    """A GC'd job and its attempt 1, Running: (job, the job's checkpoint prefix, attempt 1)."""
    base = f"s3://{bucket}/ckpt"
    job = gc_job(s, name, base, keep_last=keep_last)
    a1 = repo.create_attempt(s, job, 1)
    repo.set_attempt_state(s, a1, "Running")
    return job, f"{base}/{job.id}", a1


def test_keeps_the_last_and_every_resume_point_and_is_idempotent(s3_bucket, api):
    """Attempt 1 committed 10-30 and was superseded; a zombie of it then committed 40 in S3 (never
    recorded); attempt 2 resumed from 10 and committed 40 and 50. keep_last=2 keeps attempt 2's
    two, 10 (a resume point); GC deletes 20 and 30 (their records say `deleted`) and the zombie's."""
    with api.db.session() as s:
        job, prefix, a1 = _first_attempt(s, s3_bucket, "gc-job", keep_last=2)
        _commit(s, a1, prefix, 1, (10, 20, 30))
        repo.set_attempt_state(s, a1, "Failed", {"kind": "node.lost", "host": "algo-2"})
        a2 = repo.create_attempt(s, job, 2, resume_from=checkpoint_uri(prefix, 10, 1))
        _checkpoint(checkpoint_uri(prefix, 40, 1), 40, 1)  # the zombie's commit: S3 only
        _commit(s, a2, prefix, 2, (40, 50))
        job_id = job.id

    event = json.loads(FIXTURE.read_text().replace("JOB_ID", job_id).replace("URI", checkpoint_uri(prefix, 50, 2)))
    ctx = api.context("checkpoint_gc")
    first = checkpoint_gc.handler(event, ctx)
    assert sorted(first["deleted"]) == [
        checkpoint_uri(prefix, 20, 1),
        checkpoint_uri(prefix, 30, 1),
        checkpoint_uri(prefix, 40, 1),
    ]
    left = [(c.step, c.attempt) for c in list_checkpoints(prefix)]
    assert left == [(10, 1), (40, 2), (50, 2)]  # 10 is attempt 2's resume point
    with api.db.session() as s:
        rows = {
            (c.step, c.attempt_id[-2:]): (c.state, c.reason)
            for c in repo.list_checkpoints(s, repo.get_job(s, "default", job_id))
        }
    assert rows[(20, "a1")] == rows[(30, "a1")] == ("deleted", "deleted by checkpoint GC")
    assert {k: v[0] for k, v in rows.items() if k[0] not in (20, 30)} == {
        (10, "a1"): "good",
        (40, "a2"): "good",
        (50, "a2"): "good",
    }
    assert checkpoint_gc.handler(event, ctx)["deleted"] == []  # redelivered: nothing more to do


def test_memory_checkpoints_are_never_durable_and_a_memory_resume_keeps_its_fallback(s3_bucket, api):
    """Attempt 2 resumed from a memory checkpoint with S3's step 20 as its fallback: GC keeps 20
    however many newer S3 checkpoints come (the fallback is a resume point too), counts no memory
    checkpoint as a good one of S3's, and marks the memory records left over `deleted` with why."""
    from aerie_contracts.checkpoints import memory_uri
    from aerie_contracts.restarts import CAUSE_RESUME_FALLBACK
    from orchestrator.store.models import Checkpoint

    with api.db.session() as s:
        job, prefix, a1 = _first_attempt(s, s3_bucket, "gc-mem", keep_last=1)
        _commit(s, a1, prefix, 1, (10, 20), recorded_size=1)
        repo.set_attempt_state(s, a1, "Failed", {"kind": "silent.hang"})
        a2 = repo.create_attempt(s, job, 2, resume_from=memory_uri(job.id, 24, 1))
        a2.cause = {"mode": "in_place", CAUSE_RESUME_FALLBACK: checkpoint_uri(prefix, 20, 1)}
        repo.set_attempt_state(s, a2, "Running")
        _commit(s, a2, prefix, 2, (30, 40), recorded_size=1)
        # A memory checkpoint newer than every S3 one: good, but not one of S3's keep_last.
        meta = {"ranks": [0], "world_size": 1, "node": "algo-1", "size_bytes": 1}
        repo.record_checkpoint(s, a2, 44, memory_uri(job.id, 44, 2), meta, tier="memory")
        # A memory record the store never expired (recorded before it knew how): GC's safety net.
        s.add(Checkpoint(job_id=job.id, attempt_id=a1.id, step=5, uri=memory_uri(job.id, 5, 1), tier="memory"))
        job_id = job.id

    event = json.loads(FIXTURE.read_text().replace("JOB_ID", job_id).replace("URI", checkpoint_uri(prefix, 40, 2)))
    result = checkpoint_gc.handler(event, api.context("checkpoint_gc"))
    assert sorted(result["deleted"]) == [checkpoint_uri(prefix, 10, 1), checkpoint_uri(prefix, 30, 2)]
    assert [(c.step, c.attempt) for c in list_checkpoints(prefix)] == [(20, 1), (40, 2)]
    assert result["expired_memory"] == [memory_uri(job_id, 5, 1)]
    with api.db.session() as s:
        rows = {c.step: (c.state, c.reason) for c in repo.list_checkpoints(s, repo.get_job(s, "default", job_id))}
    assert rows[5] == ("deleted", "older than the durable (S3) checkpoint of step 40")
    assert rows[44] == ("good", None)
