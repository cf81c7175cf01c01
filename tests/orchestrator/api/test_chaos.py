"""`aerie chaos`: the request reaches the node's agent through the API and the local backend, is
audited as an event, and the agent does the fault to the real rank process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import psutil

from aerie_contracts import env, memckpt
from aerie_contracts.events import DetailType
from agent.chaos import apply_pending
from orchestrator.store import repo
from tests.agent.test_chaos import _status, rank_proc  # noqa: F401


def _running_job(app, name: str, root) -> str:
    """A local job whose attempt 1 runs on algo-1 and algo-2 (2 ranks each), its nodes under `root`."""
    with app.state.db.session() as s:
        spec = {"name": name, "backend": "local", "entrypoint": ["x"], "resources": {"procs_per_node": 2}}
        job = repo.create_job(s, spec, "default")
        attempt = repo.create_attempt(s, job, 1)
        attempt.state = "Running"
        attempt.handle = {"root": str(root), "hosts": ["algo-1", "algo-2"]}
        return job.id


def test_the_api_delivers_audits_and_the_agent_acts(api, tmp_path, rank_proc):  # noqa: F811
    client, app, admin = api
    proc = rank_proc(3, children=1)
    job_id = _running_job(app, "rehearse", tmp_path / "nodes")
    auth = {"Authorization": f"Bearer {admin}"}
    assert (
        client.post(
            f"/v1/jobs/{job_id}/chaos", json={"node": 0, "rank": 3, "fault": "sigstop"}, headers=auth
        ).status_code
        == 409
    )
    r = client.post(f"/v1/jobs/{job_id}/chaos", json={"node": 1, "rank": 3, "fault": "freeze"}, headers=auth)
    assert r.status_code == 200, r.text
    assert (
        client.post(f"/v1/jobs/{job_id}/chaos", json={"node": 1, "rank": 3, "fault": "melt"}, headers=auth).status_code
        == 422
    )
    events = client.get(f"/v1/jobs/{job_id}/events", headers=auth).json()
    audit = [e["event"] for e in events if e["event"]["detail-type"] == DetailType.CHAOS_INJECTED]
    assert audit and audit[0]["detail"]["fault"] == "freeze" and audit[0]["detail"]["host"] == "algo-2"

    node_dir = tmp_path / "nodes" / "algo-2" / "agent"
    (node_dir / "ranks").mkdir(parents=True, exist_ok=True)
    (node_dir / "ranks" / "rank-3.pid").write_text((tmp_path / "agent" / "ranks" / "rank-3.pid").read_text())
    answers = apply_pending(node_dir)
    assert [a["ok"] for a in answers] == [True] and len(answers[0]["pids"]) == 2
    assert _status(proc) == psutil.STATUS_STOPPED and _status(proc.children()[0]) == psutil.STATUS_STOPPED
    assert apply_pending(node_dir) == []  # done once


def test_a_node_loss_kills_the_whole_node_and_wipes_its_memory_at_once(api, tmp_path, monkeypatch):
    """`node-loss` is the backend's (the agent is one of its victims): every process of the node's
    tree is SIGKILLed and its shared-memory area removed; a rank fault without a rank is refused."""
    client, app, admin = api
    shm = tmp_path / "shm"
    monkeypatch.setenv(env.MEMORY_CHECKPOINT_DIR, str(shm))
    area = shm / memckpt.safe_name("algo-2", "host")
    (area / "snapshots").mkdir(parents=True)
    node_root = tmp_path / "nodes" / "algo-2"
    node_root.mkdir(parents=True)
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], env={**os.environ, env.ML_ROOT: str(node_root)}
    )
    try:
        job_id = _running_job(app, "lose", tmp_path / "nodes")
        auth = {"Authorization": f"Bearer {admin}"}
        r = client.post(f"/v1/jobs/{job_id}/chaos", json={"node": 1, "fault": "sigstop"}, headers=auth)
        assert r.status_code == 422 and "rank" in r.text
        r = client.post(f"/v1/jobs/{job_id}/chaos", json={"node": 1, "fault": "node-loss"}, headers=auth)
        assert r.status_code == 200, r.text
        assert r.json()["host"] == "algo-2" and r.json()["rank"] is None
        assert proc.wait(timeout=10) == -signal.SIGKILL
        assert not area.exists()
        events = client.get(f"/v1/jobs/{job_id}/events", headers=auth).json()
        audit = [e["event"]["detail"] for e in events if e["event"]["detail-type"] == DetailType.CHAOS_INJECTED]
        assert [(a["fault"], a["host"]) for a in audit] == [("node-loss", "algo-2")]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
