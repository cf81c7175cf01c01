"""checkpoint_gc as AWS would invoke it (EventBridge fixture + context), on the real loopback S3
server and a real API over HTTP: keeps `keep_last`, the newest good one, and any resume point."""

from __future__ import annotations

import json
from pathlib import Path

import boto3
import pytest

from lambdas import checkpoint_gc
from orchestrator.events import LambdaContext
from orchestrator.settings import Settings
from orchestrator.store import repo
from tests.helpers.live_api import start_live_api
from trainer.checkpoint.manifest import checkpoint_uri, commit, list_checkpoints

FIXTURE = Path(__file__).parent.parent / "data" / "events" / "checkpoint_committed.json"


@pytest.fixture
def api(aerie_home, s3_env):
    live = start_live_api(Settings())
    yield live
    live.stop()


def _checkpoint(uri: str, step: int) -> None:
    bucket, key = uri[len("s3://"):].split("/", 1)
    boto3.client("s3").put_object(Bucket=bucket, Key=f"{key}/__0_0.distcp", Body=b"x" * (100 + step))
    commit(uri, step=step, tokens=step * 1000)


def test_keeps_the_last_and_every_resume_point_and_is_idempotent(api, s3_bucket):
    base = f"s3://{s3_bucket}/ckpt"
    with api.db.session() as s:
        job = repo.create_job(s, {"name": "gc-job", "backend": "local", "entrypoint": ["x"],
                                  "checkpoint": {"s3_uri": base, "every_steps": 10, "keep_last": 2}}, "default")
        prefix = f"{base}/{job.id}"
        a1 = repo.create_attempt(s, job, 1)
        repo.set_attempt_state(s, a1, "Failed", {"kind": "silent.hang"})
        repo.create_attempt(s, job, 2, resume_from=checkpoint_uri(prefix, 10))
        job_id = job.id
    for step in (10, 20, 30, 40, 50):
        _checkpoint(checkpoint_uri(prefix, step), step)

    event = json.loads(FIXTURE.read_text().replace("JOB_ID", job_id).replace("URI", checkpoint_uri(prefix, 50)))
    ctx = LambdaContext(function_name="checkpoint_gc", aerie_api=api.url, aerie_token=api.service)
    first = checkpoint_gc.handler(event, ctx)
    assert sorted(first["deleted"]) == [checkpoint_uri(prefix, 20), checkpoint_uri(prefix, 30)]
    left = [c.step for c in list_checkpoints(prefix)]
    assert left == [10, 40, 50]  # 10 is attempt 2's resume point
    assert checkpoint_gc.handler(event, ctx)["deleted"] == []  # redelivered: nothing more to do
