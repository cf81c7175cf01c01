"""Checkpoint GC set-ups (tests/lambdas/test_checkpoint_gc.py, tests/orchestrator/test_crash.py):
a job with S3 checkpoints, and committed checkpoints in the loopback S3 server."""

from __future__ import annotations

import boto3

from aerie_checkpoint.manifest import commit
from orchestrator.store import repo
from orchestrator.store.models import Job


def gc_job(s, name: str, base: str, keep_last: int) -> Job:
    """A job checkpointing under `base` every 10 steps, whose GC keeps `keep_last`."""
    spec = {
        "name": name,
        "backend": "local",
        "entrypoint": ["x"],
        "checkpoint": {"s3_uri": base, "every_steps": 10, "keep_last": keep_last},
    }
    return repo.create_job(s, spec, "default")


def s3_checkpoint(uri: str, step: int, attempt: int, size: int, tokens: int = 0) -> None:
    """A committed checkpoint at `uri`: one shard of `size` bytes, then its manifest."""
    bucket, key = uri[len("s3://") :].split("/", 1)
    boto3.client("s3").put_object(Bucket=bucket, Key=f"{key}/__0_0.distcp", Body=b"x" * size)
    commit(uri, step=step, tokens=tokens, attempt=attempt)
