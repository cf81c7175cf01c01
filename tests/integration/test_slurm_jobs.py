"""The `slurm` backend end to end, on the real one-host cluster (three emulated nodes node1-node3).

A real `aerie up` with the slurm backend, the real CLI, `sbatch`/`srun`/`scancel`, and the real
agents: each Slurm task runs `agent.slurm`, which builds the node's contract and execs the agent.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from devtools.harness.control_plane import FIRST_ATTEMPT_STORY, ControlPlane, event_story
from tests.helpers.attempt_files import job_processes
from tests.helpers.contract_jobs import contract_spec
from tests.helpers.slurm_plane import slurm_control_plane, stepper_spec
from tests.helpers.wait import wait_for

NODES = {"node1", "node2", "node3"}


@pytest.fixture
def cp(request, tmp_path, slurm_cluster):
    # Serial tests start on an idle cluster; the side-by-side ones may share it with other Slurm
    # tests, so they assert no node names Slurm might not pick.
    idle_first = request.node.get_closest_marker("side_by_side") is None
    with slurm_control_plane(tmp_path / "home", slurm_cluster, idle_first=idle_first) as plane:
        yield plane


def _spec(tmp_path: Path, name: str, args: list[str], **extra) -> str:
    return contract_spec(tmp_path, name, args, backend="slurm", **extra)


def _wait_running(cp: ControlPlane, ref: str, nodes: int = 2, timeout_s: float = 90) -> dict:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        job = cp.job(ref)
        attempts = job["attempt_list"]
        if (
            attempts
            and len(attempts[-1]["nodes"]) == nodes
            and all(n["state"] == "Running" for n in attempts[-1]["nodes"])
        ):
            return job
        if job["state"] in {"Completed", "Failed", "Stopped"}:
            raise AssertionError(_ended_early(job))
        time.sleep(0.5)
    raise AssertionError(f"{ref} never had {nodes} running nodes: {json.dumps(cp.job(ref))[:2000]}")


def _ended_early(job: dict) -> str:
    """Why a job ended before its nodes ran, short enough to survive a truncated CI log: the job's
    and its attempts' reasons first, then the cluster's view of its nodes."""
    reasons = [(a["number"], a["state"], (a.get("reason") or {})) for a in job["attempt_list"]]
    sinfo = subprocess.run(["sinfo", "-N", "-h", "-o", "%N %t %E"], capture_output=True, text=True).stdout
    return f"{job['name']} ended {job['state']} before its nodes ran: {reasons!s:.1200} | sinfo: {sinfo!s:.300}"


def _handle(cp: ControlPlane, job: dict, attempt: int = 1) -> dict:
    """The attempt's backend handle, as the slurm backend recorded it beside the attempt."""
    return json.loads((cp.home / "jobs" / job["id"] / f"attempt-{attempt}" / "handle.json").read_text())


def _slurm_state(slurm_job_id: int) -> str:
    from orchestrator.backends.slurm_cli import slurm_job_state

    return (slurm_job_state(slurm_job_id) or {}).get("state", "")


# Not timing-sensitive: `make test` runs it with the unit tests, on two workers (tests/conftest.py)
# (contract-check ranks, no fault; the fault and lost-node tests below stay serial).
@pytest.mark.side_by_side
def test_two_node_job_completes_through_aerie_up(cp, tmp_path):
    r = cp.cli("submit", _spec(tmp_path, "slurm-ok", ["--steps", "3"]), "--follow", timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr + cp.log.read_text()[-3000:]
    job = cp.job("slurm-ok")
    assert job["state"] == "Completed" and job["backend"] == "slurm"
    assert event_story(cp.events("slurm-ok")) == FIRST_ATTEMPT_STORY
    attempt = job["attempt_list"][0]
    hosts = sorted(n["host"] for n in attempt["nodes"])
    assert len(set(hosts)) == 2 and set(hosts) <= NODES, hosts
    # The allocation ends once its agents have exited (each asks the control plane one last time,
    # after the job is Completed).
    slurm_job = _handle(cp, job)["slurm_job_id"]
    wait_for(what="the Slurm job to complete", check=lambda: _slurm_state(slurm_job) == "COMPLETED", timeout_s=30)

    logs = cp.cli("logs", "slurm-ok", check=True).stdout
    for host, rank in ((hosts[0], 0), (hosts[0], 1), (hosts[1], 2), (hosts[1], 3)):
        assert f"[{host} rank {rank}] contract ok=True host={host} rank={rank} world=4" in logs, logs
    assert "CONTRACT PROBLEM" not in logs


@pytest.mark.side_by_side  # as above: its only bound is 30 s for Slurm's clean-up
def test_stop_cancels_the_slurm_job_and_its_processes(cp, tmp_path):
    cp.cli("submit", _spec(tmp_path, "slurm-stop", ["--steps", "600", "--sleep", "1"]), check=True)
    job = _wait_running(cp, "slurm-stop")
    time.sleep(3)  # let torchrun start the ranks
    assert job_processes(job["id"]), "the job's processes should be running"
    stopped_at = time.time()
    cp.cli("stop", "slurm-stop", check=True)
    job = cp.wait_state("slurm-stop", {"Stopped", "Failed", "Completed"}, timeout_s=60)
    assert job["state"] == "Stopped", job
    while job_processes(job["id"]) and time.time() - stopped_at < 30:
        time.sleep(0.5)
    assert job_processes(job["id"]) == [], "processes left 30 s after aerie stop"
    slurm_id = _handle(cp, job)["slurm_job_id"]
    while _slurm_state(slurm_id) != "CANCELLED" and time.time() - stopped_at < 30:
        time.sleep(0.5)  # COMPLETING while slurmstepd cleans up
    assert _slurm_state(slurm_id) == "CANCELLED"


def _wait_attempt(cp: ControlPlane, ref: str, number: int, states: set[str], timeout_s: float = 90) -> dict:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        attempts = [a for a in cp.job(ref)["attempt_list"] if a["number"] == number]
        if attempts and attempts[0]["state"] in states:
            return attempts[0]
        time.sleep(0.5)
    raise AssertionError(f"attempt {number} of {ref} did not reach {states}: {json.dumps(cp.job(ref))[:2000]}")


def _wait_file(path: Path, timeout_s: float = 60) -> Path:
    deadline = time.time() + timeout_s
    while not path.exists():
        assert time.time() < deadline, f"{path} never appeared"
        time.sleep(0.3)
    return path


def test_rank_killed_with_sigkill_fails_the_attempt_with_exit_nonzero(cp, tmp_path):
    spec = _spec(tmp_path, "slurm-kill", ["--steps", "600", "--sleep", "1"], retry={"max_restarts": 0})
    cp.cli("submit", spec, check=True)
    job = _wait_running(cp, "slurm-kill")
    root = Path(_handle(cp, job)["root"])
    pid_file = _wait_file(root / "node2" / "agent" / "ranks" / "rank-2.pid")
    time.sleep(1)
    os.kill(int(pid_file.read_text().strip()), signal.SIGKILL)
    attempt = _wait_attempt(cp, "slurm-kill", 1, {"Failed", "Completed", "Stopped"})
    assert attempt["state"] == "Failed", attempt
    reason = attempt["reason"]
    assert reason["kind"] == "exit.nonzero", reason
    assert reason["host"] == "node2" and reason["rank"] == 2 and reason["signal"] == 9, reason
    assert cp.wait_state("slurm-kill", {"Failed", "Completed", "Stopped"}, timeout_s=60)["state"] == "Failed"
    deadline = time.time() + 30
    while job_processes(job["id"]) and time.time() < deadline:
        time.sleep(0.5)
    assert job_processes(job["id"]) == [], "the surviving node's processes outlived the failed attempt"


def test_lost_node_is_excluded_from_the_next_attempt(cp, tmp_path):
    """A node whose agent vanishes is blamed (node.lost); chaining's attempt 2 runs with --exclude."""
    spec = _spec(tmp_path, "slurm-lost", ["--steps", "15", "--sleep", "1"], nodes=1, procs=1, retry={"max_restarts": 1})
    cp.cli("submit", spec, check=True)
    job = _wait_running(cp, "slurm-lost", nodes=1)
    lost = job["attempt_list"][0]["nodes"][0]["host"]
    node_dir = Path(_handle(cp, job)["root"]) / lost / "agent"
    _wait_file(node_dir / "trainer.pgid")
    # The node "dies": its entrypoint, agent and rank tree are killed at once, nothing gets reported.
    for name in ("entrypoint.pid", "agent.pid"):
        os.kill(int(json.loads((node_dir / name).read_text())), signal.SIGKILL)
    os.killpg(int(json.loads((node_dir / "trainer.pgid").read_text())), signal.SIGKILL)

    failed = _wait_attempt(cp, "slurm-lost", 1, {"Failed", "Completed", "Stopped"})
    assert failed["state"] == "Failed" and failed["reason"]["kind"] == "node.lost", failed
    assert failed["reason"]["host"] == lost
    job = cp.wait_state("slurm-lost", {"Completed", "Failed", "Stopped"}, timeout_s=120)
    assert job["state"] == "Completed", job
    second = job["attempt_list"][1]
    assert second["exclude_nodes"] == [lost]
    (host,) = (n["host"] for n in second["nodes"])
    assert host in NODES - {lost}, host
    script = (cp.home / "jobs" / job["id"] / "attempt-2" / "job.sbatch").read_text()
    assert f"#SBATCH --exclude={lost}\n" in script


def test_a_nan_excludes_nothing_and_a_hang_excludes_its_node_with_exclude(cp, tmp_path):
    """One job, three attempts on the real cluster: attempt 1 diverges (loss.nan: no node blamed,
    attempt 2 excludes nothing and runs in place, inside attempt 1's allocation), attempt 2 hangs
    (silent.hang on its only node: blamed), attempt 3 is relaunched (a new `sbatch`) with
    `#SBATCH --exclude=<that node>` on the other node and completes."""
    faults = [{"kind": "nan", "step": 3, "attempt": 1}, {"kind": "busy_hang", "step": 3, "attempt": 2}]
    health = {"startup_grace_s": 1, "hang_floor_s": 3, "heartbeat_s": 1}
    spec = stepper_spec(tmp_path, "slurm-blame", steps=8, step_s=0.2, faults=faults, health=health)
    cp.cli("submit", str(spec), check=True)
    job = cp.wait_state("slurm-blame", {"Completed", "Failed", "Stopped"}, timeout_s=180)
    assert job["state"] == "Completed", json.dumps(job)[:3000]
    first, second, third = job["attempt_list"]
    assert first["reason"]["kind"] == "loss.nan" and second["reason"]["kind"] == "silent.hang"
    hang_host = second["nodes"][0]["host"]
    assert [(b["attempt_id"], b["host"], b["rule"]) for b in job["blames"]] == [(second["id"], hang_host, "only_node")]
    assert second["exclude_nodes"] == [] and third["exclude_nodes"] == [hang_host]
    assert [a["cause"]["mode"] for a in (second, third)] == ["in_place", "relaunch"]
    (host,) = (n["host"] for n in third["nodes"])
    assert host in NODES - {hang_host}, host
    root = cp.home / "jobs" / job["id"]
    # Attempt 2 ran in attempt 1's allocation, which excluded nothing; attempt 3 is a new one.
    assert "--exclude" not in (root / "attempt-1" / "job.sbatch").read_text()
    assert not (root / "attempt-2").exists()
    assert f"#SBATCH --exclude={hang_host}\n" in (root / "attempt-3" / "job.sbatch").read_text()
    assert _handle(cp, job, 3)["slurm_job_id"] != _handle(cp, job, 1)["slurm_job_id"]
