"""Acceptance 8 of issue 17: a node SIGSTOPped mid-run is declared lost and fenced.

One real run (`aerie up`, an agent, the real trainer, the loopback S3 server through a throttling
proxy, the chain_restart handler) of a one-node job whose attempt-1 rank runs "on another
machine" (`tests/helpers/offnode_rank.py`: the test starts it, outside the node's process tree and
its environment, so the local backend cannot reach it, as it could not reach a partitioned host):

1. the rank is held mid-upload of its step-20 checkpoint (the proxy slowed to a trickle), and every
   process of the node and the rank is SIGSTOPped;
2. the control plane declares the node lost; every process of the node it can reach is gone at
   once (within the stop grace), frozen as they were;
3. attempt 2 resumes from step 10 and commits its own step 20 (and the rest, and completes);
4. the stale rank is resumed (SIGCONT): it finishes its upload, its commit is refused, it stops
   itself, and none of its objects ever becomes part of a good checkpoint.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import psutil
import pytest

from devtools.harness.jobs import trainer_spec
from devtools.s3proxy import ThrottlingProxy
from orchestrator.backends.local import STOP_GRACE_S
from tests.helpers.planes import running_control_plane
from tests.helpers.wait import wait_for

pytestmark = pytest.mark.slow

STEPS, EVERY = 40, 10
FAST, TRICKLE = 200e6, 16e3  # bytes/s per connection


class OffNode:
    """Runs the ranks that `offnode_rank.py` hands over, as children of this test (not of the node),
    without the node's AERIE_ML_ROOT and with S3 through `s3_endpoint`."""

    def __init__(self, log: Path, s3_endpoint: str):
        self.dir = tempfile.mkdtemp(prefix="offnode-")  # short: unix socket paths are limited
        self.path = os.path.join(self.dir, "sock")
        self.log, self.s3_endpoint = log, s3_endpoint
        self.procs: list[subprocess.Popen] = []
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(self.path)
        self.sock.listen(4)
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._run, args=(conn,), daemon=True).start()

    def _run(self, conn: socket.socket) -> None:
        request = json.loads(conn.makefile().readline())
        env = dict(request["env"])
        env.pop("AERIE_ML_ROOT")
        env.update(AERIE_S3_ENDPOINT=self.s3_endpoint, AWS_ENDPOINT_URL=self.s3_endpoint)
        with open(self.log, "ab") as out:
            proc = subprocess.Popen(
                request["argv"], env=env, cwd=request["cwd"], stdout=out, stderr=out, start_new_session=True
            )
        self.procs.append(proc)
        code = proc.wait()
        try:
            conn.sendall(f"{code}\n".encode())
        except OSError:
            pass  # the wrapper on the node was killed (fenced)
        conn.close()

    def close(self) -> None:
        self.sock.close()
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@pytest.fixture
def cp(tmp_path):
    with running_control_plane(tmp_path / "home", s3=True) as plane:
        yield plane


def _node_pids(ml_root: Path) -> list[int]:
    pids = []
    for proc in psutil.process_iter(["environ", "status"]):
        try:
            if proc.info["status"] != psutil.STATUS_ZOMBIE and (proc.info["environ"] or {}).get("AERIE_ML_ROOT") == str(
                ml_root
            ):
                pids.append(proc.pid)
        except psutil.Error:
            pass
    return pids


def test_a_stopped_node_is_fenced_and_its_stale_rank_never_commits(cp, tmp_path, monkeypatch):
    s3 = json.loads((cp.home / "devstack" / "s3.json").read_text())
    for key, value in {
        "AWS_ENDPOINT_URL": s3["endpoint_url"],
        "AERIE_S3_ENDPOINT": s3["endpoint_url"],
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(key, value)
    from aerie_checkpoint import gc as ckpt_gc
    from aerie_checkpoint import manifest

    proxy = ThrottlingProxy("127.0.0.1", s3["port"], rate=FAST).start()
    offnode = OffNode(tmp_path / "offnode-rank.log", proxy.endpoint_url)
    try:
        spec_path = trainer_spec(
            tmp_path / "fenced.json",
            "fenced",
            steps=STEPS,
            nodes=1,
            procs=1,
            checkpoint_uri="s3://aerie/fencing",
            every_steps=EVERY,
            max_restarts=1,
            env={"OFFNODE_SOCKET": offnode.path},
            # Attempt 1 only: half-second steps after step 10, time to slow S3 before step 20's save.
            faults=[{"kind": "slow", "step": EVERY + 1, "rank": 0, "seconds": 0.5, "attempt": 1}],
        )
        spec = json.loads(spec_path.read_text())
        spec["entrypoint"] = ["python", "tests/helpers/offnode_rank.py", "--", *spec["entrypoint"]]
        spec_path.write_text(json.dumps(spec))
        job_id = cp.submit(spec_path, "fenced", timeout_s=180)
        prefix = f"s3://aerie/fencing/{job_id}"
        node = cp.home / "jobs" / job_id / "attempt-1" / "algo-1"
        step10, zombie = manifest.checkpoint_uri(prefix, 10, 1), manifest.checkpoint_uri(prefix, 20, 1)

        # 1. Step 10 committed (and recorded), then S3 slowed to a trickle and the step-20 upload caught open.
        def recorded() -> dict[str, str]:
            return {c["uri"]: c["state"] for c in cp.get(f"/v1/jobs/{job_id}/checkpoints")}

        wait_for(what="step 10 recorded", check=lambda: recorded().get(step10) == "good", timeout_s=180)
        proxy.set_rate(TRICKLE)
        wait_for(
            what="the step-20 upload in flight",
            check=lambda: ckpt_gc.list_incomplete_uploads(zombie),
            every_s=0.05,
            timeout_s=180,
        )
        [rank] = offnode.procs
        stopped = [psutil.Process(pid) for pid in _node_pids(node)] + [psutil.Process(rank.pid)]
        for proc in stopped:
            proc.suspend()
        assert len(stopped) >= 4  # entrypoint, agent, agent.rank, the wrapper; and the rank
        assert manifest.read_manifest(zombie) is None

        # 2. Declared lost; what the backend can reach of the node is gone at once, frozen as it was.
        def attempt(n: int) -> dict | None:
            attempts = cp.job("fenced")["attempt_list"]
            return attempts[n - 1] if len(attempts) >= n else None

        failed = wait_for(
            what="attempt 1 failed", check=lambda: (a := attempt(1)) and a["state"] == "Failed" and a, timeout_s=60
        )
        lost_at = time.time()
        assert failed["reason"]["kind"] == "node.lost" and failed["reason"]["host"] == "algo-1", failed
        wait_for(
            what="the node's processes gone", check=lambda: not _node_pids(node), timeout_s=STOP_GRACE_S, every_s=0.05
        )
        fenced_s = time.time() - lost_at
        assert fenced_s < 5, fenced_s  # killed by the fence, not by the stop's grace backstop
        assert rank.poll() is None and psutil.Process(rank.pid).status() == psutil.STATUS_STOPPED  # out of reach

        # 3. Attempt 2 resumes from step 10 and commits its own step 20.
        second = wait_for(what="attempt 2", check=lambda: attempt(2), timeout_s=180)
        assert second["resume_from"] == step10
        theirs = manifest.checkpoint_uri(prefix, 20, 2)
        wait_for(what="attempt 2's step 20 recorded", check=lambda: recorded().get(theirs) == "good", timeout_s=120)

        # 4. The stale rank resumes: it finishes its upload, is refused, and stops itself.
        proxy.set_rate(FAST)
        psutil.Process(rank.pid).resume()  # SIGCONT
        code = rank.wait(timeout=120)
        log = (tmp_path / "offnode-rank.log").read_text()
        assert code == 128 + signal.SIGTERM, log[-3000:]
        assert "this attempt was superseded" in log, log[-3000:]
        job = cp.wait_state("fenced", {"Completed", "Failed"}, timeout_s=180)
        assert job["state"] == "Completed" and len(job["attempt_list"]) == 2, job

        # It wrote into its own attempt's directory (the refused commit comes after the upload), and
        # nothing of it is in a good checkpoint. Its objects may already be gone: attempt 2's later
        # commits run the GC, which deletes incomplete checkpoints older than the newest good one.
        assert f"checkpoint {zombie} not committed: this attempt was superseded" in log, log[-3000:]
        infos = manifest.list_checkpoints(prefix)
        stale = [i for i in infos if i.attempt == 1 and i.step >= 20]
        stale_keys = {k for i in stale for k in i.keys}
        assert all(k.startswith("step_000000") and "/attempt_0001/" in k for k in stale_keys), stale_keys
        assert ckpt_gc.list_incomplete_uploads(zombie) == []  # the upload did finish
        assert all(i.state == "incomplete" for i in stale), [(i.uri, i.state, i.reasons) for i in stale]
        record = recorded()
        assert not [u for u in record if "/attempt_0001" in u and manifest.parse_uri(u).step >= 20], record
        good = [i for i in manifest.list_checkpoints(prefix, record) if i.good]
        assert good and all(i.attempt == 2 or i.step == 10 for i in good), [i.uri for i in good]
        for info in good:
            assert not {f"{info.uri[len(prefix) + 1 :]}/{o['key']}" for o in info.manifest["objects"]} & stale_keys
        assert manifest.last_good(prefix, recorded=record) == manifest.checkpoint_uri(prefix, STEPS, 2)
    finally:
        offnode.close()
        proxy.stop()
        for proc in psutil.process_iter():
            try:
                if proc.status() == psutil.STATUS_STOPPED and proc.ppid() == os.getpid():
                    proc.kill()
            except psutil.Error:
                pass
