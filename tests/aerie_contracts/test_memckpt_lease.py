"""No job's snapshots stay in /dev/shm (aerie_contracts/memckpt_lease.py): an area is claimed by its agent's
lease; a later agent (or a local launch) removes the areas of other jobs whose owner is gone and
whose lease is stale, never its own job's, a live owner's or a just-stopped one's (a relaunch takes
it back). Real processes, killed with SIGKILL."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from aerie_contracts import env as E
from aerie_contracts import memckpt
from aerie_contracts import memckpt_lease as lease
from agent.memckpt.node import NodeMemoryTier
from tests.agent.memckpt.test_node import _port
from tests.agent.memckpt.test_replicate import KEY_HEX, REPO, payload

HOLDER = r"""
import sys, time
from pathlib import Path
from aerie_contracts import memckpt_lease as lease
lease.Lease(Path(sys.argv[1]), job=sys.argv[2], host="algo-1", refresh_s=0.1).start()
print("leased", flush=True)
time.sleep(120)
"""


def _area(root: Path, job: str, *, snapshot: bool = True) -> Path:
    area = memckpt.area_dir(root, job)
    (area / memckpt.LOCAL).mkdir(parents=True, exist_ok=True)
    if snapshot:
        (area / memckpt.LOCAL / memckpt.file_name(4, 0)).write_bytes(payload(100, 1))
    return area


def _age(area: Path, seconds: float) -> None:
    """Make every timestamp the sweep reads `seconds` old."""
    then = time.time() - seconds
    for path in [area / lease.LEASE, area / memckpt.LOCAL, area]:
        if path.exists():
            os.utime(path, (then, then))


def _holder(area: Path, job: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(area), job], cwd=REPO, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "leased"
    return proc


def test_the_area_of_a_killed_agent_goes_once_its_lease_is_stale(tmp_path):
    area = _area(tmp_path, "job-old")
    holder = _holder(area, "job-old")
    try:
        info = json.loads((area / lease.LEASE).read_text())
        assert info["pid"] == holder.pid and lease.owner_alive(info)
        _age(area, 3600)
        assert lease.sweep(tmp_path, keep="job-new") == []  # a live owner keeps it, however old
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=10)
    os.utime(area / lease.LEASE)
    assert lease.sweep(tmp_path, keep="job-new") == []  # just gone: a relaunch may take it back
    _age(area, lease.STALE_S + 5)
    assert lease.sweep(tmp_path, keep="job-new") == [area] and not area.exists()


def test_the_sweeper_keeps_its_own_job_and_what_is_not_an_area(tmp_path):
    own = _area(tmp_path, "job-new")
    bare = _area(tmp_path, "job-bare")  # no lease at all (written before leases, or torn)
    other = tmp_path / "someone-elses"
    other.mkdir()
    (tmp_path / "a-file").write_text("x")
    for folder in (own, bare, other):
        _age(folder, lease.STALE_S + 5)
    assert lease.sweep(tmp_path, keep="job-new") == [bare]
    assert own.exists() and other.exists() and (tmp_path / "a-file").exists()
    recent = _area(tmp_path, "job-recent")  # a lease-less area still being written: kept
    assert lease.sweep(tmp_path, keep="job-new") == [] and recent.exists()


def test_a_reused_pid_is_not_the_owner(tmp_path):
    area = _area(tmp_path, "job-old")
    lease.write(area, job="job-old", host="algo-1")
    info = json.loads((area / lease.LEASE).read_text())
    assert lease.owner_alive(info)  # this very process
    (area / lease.LEASE).write_text(json.dumps({**info, "start": info["start"] - 1000}))
    _age(area, lease.STALE_S + 5)
    assert lease.sweep(tmp_path) == [area]


def test_a_starting_tier_sweeps_its_root_and_a_local_launch_every_node(tmp_path, monkeypatch):
    hosts = ["algo-1", "algo-2"]
    old = _area(tmp_path / "algo-1", "job-old")
    (old / lease.LEASE).write_text(json.dumps({"pid": 1 << 22, "start": 1.0, "job": "job-old", "host": "algo-1"}))
    _age(old, lease.STALE_S + 5)
    env = {
        E.MEMORY_CHECKPOINT_EVERY: "4",
        E.MEMORY_CHECKPOINT_DIR: str(tmp_path / "algo-1"),
        E.MEMORY_CHECKPOINT_PEERS: f"algo-1=127.0.0.1:{_port()},algo-2=127.0.0.1:{_port()}",
        E.JOB: "job-new",
        E.MEMORY_CHECKPOINT_KEY: KEY_HEX,
    }
    tier = NodeMemoryTier.from_env(env, host="algo-1", hosts=hosts)
    assert tier is not None
    tier.start()
    try:
        assert not old.exists()
        mine = memckpt.area_dir(tmp_path / "algo-1", "job-new")
        assert json.loads((mine / lease.LEASE).read_text())["pid"] == os.getpid()
    finally:
        tier.close(job_over=False)  # a failure: the area stays...
    assert mine.exists()
    gone = {"pid": 1 << 22, "start": 1.0, "job": "job-new", "host": "algo-1"}
    (mine / lease.LEASE).write_text(json.dumps(gone))  # ...and the agent (this process here) exits
    monkeypatch.setattr(lease, "STALE_S", 0.0)
    # ...so a local launch of another job (every node folder of the host) takes it, and the
    # node folders left empty.
    other = _area(tmp_path / "algo-2", "job-other")
    assert lease.sweep_nodes(tmp_path, keep="job-other") == [mine]
    assert not (tmp_path / "algo-1").exists() and other.exists()
