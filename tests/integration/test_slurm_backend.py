"""The slurm backend's own calls against the real one-host cluster, without a control plane."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from devtools.harness.control_plane import REPO
from orchestrator.backends.base import LaunchRequest
from orchestrator.backends.slurm import SlurmBackend
from orchestrator.backends.slurm_cli import slurm_job_state
from orchestrator.placement import PlacementError
from orchestrator.spec import JobSpec
from tests.helpers.launch_requests import attempt_request

# Not timing-sensitive: `make test` runs it with the unit tests, on two workers (tests/conftest.py):
# the backend's own calls on one-node contract-check jobs (a 60 s heartbeat), no verdicts.
pytestmark = pytest.mark.side_by_side


def _request(job_id: str, exclude: tuple[str, ...] = (), args: tuple[str, ...] = ("--steps", "2")) -> LaunchRequest:
    spec = JobSpec.model_validate(
        {
            "name": "direct",
            "entrypoint": ["python", "tests/e2e/contract_check.py"],
            "args": list(args),
            "resources": {"instance_count": 1, "procs_per_node": 1},
            "backend": "slurm",
            "backend_options": {"workdir": str(REPO)},
            "health": {"heartbeat_s": 60},
        }
    )
    return attempt_request(spec, 1, job_id, api_url="http://127.0.0.1:9", agent_token="unused", exclude_nodes=exclude)


def _poll_until_terminal(backend: SlurmBackend, handle: dict, timeout_s: float = 90):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        result = backend.poll(handle)
        if result.terminal:
            return result
        time.sleep(0.5)
    raise AssertionError(f"slurm job {handle} did not end: {backend.poll(handle)}")


@pytest.mark.parametrize("excluded, expected_host", [("node1", "node2"), ("node2", "node1")])
def test_excluded_node_is_not_used_and_launch_is_idempotent(slurm_cluster, tmp_path, excluded, expected_host):
    backend = SlurmBackend(tmp_path / "jobs")
    job_id = f"direct-{excluded}-{int(time.time() * 1000) % 10**8}"
    request = _request(job_id, exclude=(excluded,))
    handle = backend.launch(request)
    assert backend.launch(request) == handle  # a second launch of the same attempt submits nothing
    root = Path(handle["root"])
    (root / "handle.json").unlink()  # a controller that died before recording the job id ...
    assert backend.launch(request)["slurm_job_id"] == handle["slurm_job_id"]  # ... finds it by name

    result = _poll_until_terminal(backend, handle)
    assert result.state == "Completed", (result, backend.logs(handle))
    assert [n.host for n in result.nodes] == [expected_host]
    assert f"#SBATCH --exclude={excluded}\n" in (root / "job.sbatch").read_text()
    # The node's exit.json can come a moment before Slurm sees the task end.
    deadline = time.time() + 20
    while slurm_job_state(handle["slurm_job_id"])["state"] != "COMPLETED" and time.time() < deadline:
        time.sleep(0.3)
    assert slurm_job_state(handle["slurm_job_id"])["state"] == "COMPLETED"
    logs = backend.logs(handle)
    assert f"contract ok=True host={expected_host} rank=0 world=1" in logs[expected_host]["text"]
    resource = json.loads((root / expected_host / "input" / "config" / "resourceconfig.json").read_text())
    assert resource["hosts"] == [expected_host] and resource["current_host"] == expected_host


def test_a_job_whose_every_node_is_excluded_fails_to_place_with_slurms_reason(slurm_cluster, tmp_path):
    """Excluding every node is refused by sbatch itself; the attempt fails as placement.failed
    (not retried) instead of waiting in the queue forever or being retried through the budget."""
    backend = SlurmBackend(tmp_path / "jobs")
    request = _request(f"direct-none-{int(time.time() * 1000) % 10**8}", exclude=("node1", "node2", "node3"))
    with pytest.raises(PlacementError) as err:
        backend.launch(request)
    assert err.value.failure_kind == "placement.failed"
    assert "node1, node2, node3 excluded" in str(err.value) and "Requested node configuration is not available" in str(
        err.value
    )


def test_job_that_cannot_start_fails_with_slurms_reason(slurm_cluster, tmp_path):
    """A bootstrap that cannot run (missing interpreter) ends the attempt Failed, with Slurm's output."""
    backend = SlurmBackend(tmp_path / "jobs", python="/nonexistent/python")
    handle = backend.launch(_request(f"direct-bad-{int(time.time() * 1000) % 10**8}"))
    result = _poll_until_terminal(backend, handle)
    assert result.state == "Failed"
    assert result.reason["kind"] == "launch.failed" and result.reason["slurm_state"] == "FAILED", result.reason
    assert "/nonexistent/python" in result.reason["message"]


def test_poll_fails_loudly_when_slurmctld_does_not_answer(slurm_cluster, tmp_path, monkeypatch):
    """An unreachable controller is an error to retry, never a reason to call a running job lost."""
    import re

    from orchestrator.backends.slurm_cli import SlurmError

    conf = tmp_path / "slurm.conf"
    # Nothing listens on port 9; a short MessageTimeout makes Slurm's client give up in 1 s, not 9.
    conf.write_text(
        re.sub(r"(?m)^SlurmctldPort=\d+$", "SlurmctldPort=9", Path(slurm_cluster["SLURM_CONF"]).read_text())
        + "\nMessageTimeout=2\n"
    )
    monkeypatch.setenv("SLURM_CONF", str(conf))
    root = tmp_path / "attempt-1"
    root.mkdir()
    with pytest.raises(SlurmError):
        SlurmBackend(tmp_path).poll({"root": str(root), "slurm_job_id": 1, "hosts": []})


def test_fencing_a_stopped_node_kills_its_processes_without_resuming_them(slurm_cluster, tmp_path):
    """Every process of the job's node SIGSTOPped (a paused machine); the fence SIGKILLs them through
    Slurm at once (a plain scancel would SIGCONT + SIGTERM them into their graceful path first)."""
    import psutil

    backend = SlurmBackend(tmp_path / "jobs")
    handle = backend.launch(
        _request(f"direct-fence-{int(time.time() * 1000) % 10**8}", args=("--steps", "600", "--sleep", "1"))
    )
    root = Path(handle["root"])

    def node_procs() -> list[psutil.Process]:
        found = []
        for proc in psutil.process_iter(["environ", "status"]):
            try:
                if proc.info["status"] != psutil.STATUS_ZOMBIE and str(
                    (proc.info["environ"] or {}).get("AERIE_ML_ROOT", "")
                ).startswith(str(root)):
                    found.append(proc)
            except psutil.Error:
                pass
        return found

    deadline = time.time() + 90
    while not list(root.glob("*/agent/ranks/rank-0.pid")) or len(node_procs()) < 2:
        assert time.time() < deadline, backend.logs(handle)
        time.sleep(0.3)
    stopped = node_procs()
    for proc in stopped:
        proc.suspend()
    backend.fence(handle, [p.name for p in root.iterdir() if (p / "agent").is_dir()])
    deadline = time.time() + 15
    while node_procs():
        assert time.time() < deadline, [(p.pid, p.status()) for p in node_procs()]
        time.sleep(0.2)
    # Killed while stopped: the agent never ran its graceful path, which would have written its exit.
    exits = {str(p): p.read_text() for p in root.glob("*/agent/exit.json")}
    assert not exits, (exits, backend.logs(handle))
    backend.stop(handle)  # what the controller does next: nothing that would resume anything
    result = _poll_until_terminal(backend, handle)
    assert result.state in ("Stopped", "Failed"), result
