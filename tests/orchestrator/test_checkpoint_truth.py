"""Acceptance 9 of issue 17: `aerie checkpoints` tells the truth — each checkpoint's real size (from
its manifest), `bad` once verification failed, `deleted` once GC removed it — and so does the
dashboard's checkpoints page.

Real parts: the API over HTTP (uvicorn in this process, SQLite store), the loopback S3 server, the
trainer's fenced commit (`aerie_checkpoint.fence`, what rank 0 runs), the `chain_restart` and
`checkpoint_gc` handlers as Lambda would call them, and the CLI itself.
"""

from __future__ import annotations

import json
from pathlib import Path

import boto3
import httpx
import pytest
from typer.testing import CliRunner

from aerie_checkpoint import fence, manifest
from lambdas import chain_restart, checkpoint_gc
from orchestrator.cli import app
from orchestrator.events import LambdaContext
from orchestrator.store import repo
from recovery import resume

DATA = Path(__file__).parents[1] / "data" / "events"


@pytest.fixture
def api(s3_env, live_api):
    """The live API over HTTP (here, not the in-process client of tests/orchestrator/conftest.py)."""
    return live_api


def _gate(api, attempt_id: str, number: int) -> fence.CommitGate:
    with api.db.session() as s:
        token = repo.mint_token(s, "agent", attempt_id=attempt_id)
    return fence.CommitGate(api.url, token, attempt_id, number, record_budget_s=2.0)


def _save(gate: fence.CommitGate, prefix: str, step: int) -> str:
    """A two-rank save of `step` (shards of 1 MB and step KB), committed the trainer's way."""
    uri = manifest.checkpoint_uri(prefix, step, gate.attempt)
    bucket, key = uri[len("s3://") :].split("/", 1)
    client = boto3.client("s3")
    client.put_object(Bucket=bucket, Key=f"{key}/.metadata", Body=b"m" * 1000)
    client.put_object(Bucket=bucket, Key=f"{key}/__0_0.distcp", Body=b"0" * 1_000_000)
    client.put_object(Bucket=bucket, Key=f"{key}/__1_0.distcp", Body=b"1" * (step * 1000))
    fence.commit(uri, gate, step=step, tokens=step, attempt=gate.attempt, attempt_id=gate.attempt_id)
    return uri


def _table(job_id: str) -> dict[int, str]:
    out = CliRunner().invoke(app, ["checkpoints", job_id], env={"COLUMNS": "400"})
    assert out.exit_code == 0, out.output
    return {
        int(line.split()[1]): line
        for line in out.output.splitlines()
        if line.split()[1:2] and line.split()[1].isdigit()
    }


def test_sizes_bad_after_failed_verification_and_deleted_after_gc(api, s3_bucket, monkeypatch):
    monkeypatch.setenv("AERIE_API", api.url)
    monkeypatch.setenv("AERIE_TOKEN", api.admin)
    base = f"s3://{s3_bucket}/ckpt"
    spec = {
        "name": "truth",
        "backend": "local",
        "entrypoint": ["python", "-m", "trainer.train"],
        "checkpoint": {"s3_uri": base, "every_steps": 10, "keep_last": 3},
        "retry": {"max_restarts": 2},
    }
    with api.db.session() as s:
        job = repo.create_job(s, spec, "default")
        repo.set_job_state(s, job, "InProgress")
        repo.set_attempt_state(s, repo.create_attempt(s, job, 1), "Running")
        job_id = job.id
    prefix = f"{base}/{job_id}"
    first = _gate(api, f"{job_id}-a1", 1)
    uris = {step: _save(first, prefix, step) for step in (10, 20, 30, 40)}

    table = _table(job_id)
    assert all(" good " in table[step] for step in uris)
    assert "1.0 MB" in table[10] and "1.0 MB" in table[40]  # 1,011,000 and 1,041,000 bytes
    rows = httpx.get(f"{api.url}/v1/jobs/{job_id}/checkpoints", headers={"Authorization": f"Bearer {api.admin}"})
    sizes = {r["step"]: r["size_bytes"] for r in rows.json()}
    assert (
        sizes
        == {s: manifest.read_manifest(uris[s])["total_bytes"] for s in uris}
        == {s: 1_001_000 + s * 1000 for s in uris}
    )

    # Step 40 loses a shard; attempt 1 fails; chain_restart's verification finds it out.
    bucket, key = uris[40][len("s3://") :].split("/", 1)
    boto3.client("s3").delete_object(Bucket=bucket, Key=f"{key}/__1_0.distcp")
    with api.db.session() as s:
        repo.set_attempt_state(s, repo.get_attempt(s, f"{job_id}-a1"), "Failed", {"kind": "silent.hang"})
    event = json.loads((DATA / "attempt_failed.json").read_text().replace("JOB_ID", job_id))
    event["detail"].update(attempt=1, attempt_id=f"{job_id}-a1")
    ctx = LambdaContext(function_name="chain_restart", aerie_api=api.url, aerie_token=api.service)
    decided = chain_restart.handler(event, ctx)
    assert decided["action"] == "restart" and decided["resume_from"] == uris[30]
    table = _table(job_id)
    assert " bad " in table[40] and "verification failed" in table[40] and "__1_0.distcp: missing" in table[40]
    assert " good " in table[30]

    # Attempt 2 resumes from 30 and commits 50; GC keeps the last three good ones (20, 30, 50).
    with api.db.session() as s:
        repo.set_attempt_state(s, repo.get_attempt(s, f"{job_id}-a2"), "Running")
    uris[50] = _save(_gate(api, f"{job_id}-a2", 2), prefix, 50)
    event = json.loads(
        (DATA / "checkpoint_committed.json").read_text().replace("JOB_ID", job_id).replace("URI", uris[50])
    )
    ctx = LambdaContext(function_name="checkpoint_gc", aerie_api=api.url, aerie_token=api.service)
    assert sorted(checkpoint_gc.handler(event, ctx)["deleted"]) == [uris[10], uris[40]]
    table = _table(job_id)
    assert " deleted " in table[10] and "deleted by checkpoint GC" in table[10]
    assert " deleted " in table[40]  # bad, then deleted
    assert all(" good " in table[s] for s in (20, 30, 50))
    assert "1.1 MB" in table[50]

    # The dashboard's checkpoints page says the same.
    with httpx.Client(base_url=api.url) as web:
        web.post("/ui/login", data={"token": api.admin}, follow_redirects=True)
        page = web.get(f"/ui/jobs/{job_id}/checkpoints").text
    assert page.count('class="ck ck-deleted"') == 2 and page.count('class="ck ck-good"') == 3
    assert "deleted by checkpoint GC" in page and "1.1 MB" in page


def test_memory_tier_reports_over_the_agents_route(api, s3_bucket):
    """Issue #22: two nodes report their part of a memory checkpoint the agent's way (HTTP, the
    node route, `agent.memckpt.ring.report_body`); the job's record shows it `incomplete`, then
    `good` with tier `memory` beside an S3 one, and `chain_restart` verifies only the S3 rows (a
    memory row has no objects and is never reported bad for it). A wrong tier is a 422."""
    from agent.memckpt.ring import Replicated, report_body

    base = f"s3://{s3_bucket}/ckpt"
    spec = {"name": "mem", "backend": "local", "entrypoint": ["python", "-m", "trainer.train"]}
    spec["checkpoint"] = {"s3_uri": base}
    with api.db.session() as s:
        job = repo.create_job(s, spec, "default")
        repo.set_job_state(s, job, "InProgress")
        repo.set_attempt_state(s, repo.create_attempt(s, job, 1), "Running")
        job_id = job.id
        token = repo.mint_token(s, "agent", attempt_id=f"{job_id}-a1")
    _save(_gate(api, f"{job_id}-a1", 1), f"{base}/{job_id}", 10)
    agent = httpx.Client(base_url=api.url, headers={"Authorization": f"Bearer {token}"})
    admin = {"Authorization": f"Bearer {api.admin}"}

    def states() -> dict[int, tuple[str, str]]:
        rows = httpx.get(f"{api.url}/v1/jobs/{job_id}/checkpoints", headers=admin).json()
        return {r["step"]: (r["state"], r["tier"]) for r in rows}

    for node, ranks, peer in (("algo-1", [0, 1], "algo-2"), ("algo-2", [2, 3], "algo-1")):
        body = report_body(Replicated(12, ranks, 10), job=job_id, attempt=1, node=node, world_size=4, peer_node=peer)
        assert agent.post(f"/v1/attempts/{job_id}-a1/nodes/{node}/checkpoints", json=body).status_code == 200
        if node == "algo-1":
            assert states() == {10: ("good", "s3"), 12: ("incomplete", "memory")}
    assert states() == {10: ("good", "s3"), 12: ("good", "memory")}
    wrong = dict(body, tier="s3")
    assert agent.post(f"/v1/attempts/{job_id}-a1/nodes/algo-2/checkpoints", json=wrong).status_code == 422

    from lambdas.api import Api

    recorded = resume.recorded_checkpoints(Api(api.url, api.admin), job_id)
    assert list(recorded) == [manifest.checkpoint_uri(f"{base}/{job_id}", 10, 1)]
