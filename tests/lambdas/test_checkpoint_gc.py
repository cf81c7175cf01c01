"""checkpoint_gc as AWS would invoke it (EventBridge fixture + context), on the real loopback S3
server and a real API over HTTP: keeps `keep_last`, the newest good one, and any resume point."""

from __future__ import annotations

import json
from pathlib import Path

from lambdas import checkpoint_gc
from orchestrator.store import repo
from tests.helpers.gc_jobs import gc_job, s3_checkpoint
from trainer.checkpoint.manifest import checkpoint_uri, list_checkpoints

FIXTURE = Path(__file__).parent.parent / "data" / "events" / "checkpoint_committed.json"


def _checkpoint(uri: str, step: int, attempt: int) -> None:
    """Sizes and token counts that tell the steps apart."""
    s3_checkpoint(uri, step, attempt, 100 + step, tokens=step * 1000)


def test_keeps_the_last_and_every_resume_point_and_is_idempotent(s3_bucket, api):
    """Attempt 1 committed 10-30 and was superseded; a zombie of it then committed 40 in S3 (never
    recorded); attempt 2 resumed from 10 and committed 40 and 50. keep_last=2 keeps attempt 2's
    two, 10 (a resume point); GC deletes 20 and 30 (their records say `deleted`) and the zombie's."""
    base = f"s3://{s3_bucket}/ckpt"
    with api.db.session() as s:
        job = gc_job(s, "gc-job", base, keep_last=2)
        prefix = f"{base}/{job.id}"
        a1 = repo.create_attempt(s, job, 1)
        repo.set_attempt_state(s, a1, "Running")
        for step in (10, 20, 30):
            _checkpoint(checkpoint_uri(prefix, step, 1), step, 1)
            repo.record_checkpoint(s, a1, step, checkpoint_uri(prefix, step, 1), {"size_bytes": 100 + step})
        repo.set_attempt_state(s, a1, "Failed", {"kind": "node.lost", "host": "algo-2"})
        a2 = repo.create_attempt(s, job, 2, resume_from=checkpoint_uri(prefix, 10, 1))
        _checkpoint(checkpoint_uri(prefix, 40, 1), 40, 1)  # the zombie's commit: S3 only
        for step in (40, 50):
            _checkpoint(checkpoint_uri(prefix, step, 2), step, 2)
            repo.record_checkpoint(s, a2, step, checkpoint_uri(prefix, step, 2), {"size_bytes": 100 + step})
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
