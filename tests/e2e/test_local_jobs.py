"""End to end on the local backend: a real `aerie up`, the real CLI, real agents and torchrun."""

from __future__ import annotations

import time

import psutil
import pytest

from devtools.harness.control_plane import FIRST_ATTEMPT_STORY, event_story
from tests.helpers.contract_jobs import contract_spec
from tests.helpers.planes import running_control_plane

# Not timing-sensitive: `make test` runs it with the unit tests, on two workers (tests/conftest.py):
# contract-check ranks (no model), no fault detection, no timing asserted.
pytestmark = pytest.mark.side_by_side


@pytest.fixture
def cp(tmp_path):
    with running_control_plane(tmp_path / "home") as plane:
        yield plane


def _all_nodes_running(job: dict) -> bool:
    attempts = job["attempt_list"]
    return (
        bool(attempts)
        and len(attempts[-1]["nodes"]) == 2
        and all(n["state"] == "Running" for n in attempts[-1]["nodes"])
    )


def test_two_nodes_two_procs_job_completes_with_events_and_logs(cp, tmp_path):
    r = cp.cli("submit", contract_spec(tmp_path, "ok-job", ["--steps", "3"]), "--follow")
    assert r.returncode == 0, r.stdout + r.stderr
    job = cp.job("ok-job")
    assert job["state"] == "Completed"
    assert len(job["attempt_list"]) == 1
    assert event_story(cp.events("ok-job")) == FIRST_ATTEMPT_STORY

    events = cp.cli("events", "ok-job", check=True).stdout
    order = [events.index(word) for word in ("Submitted", "Running", "attempt 1 Completed", "Completed")]
    assert order == sorted(order)

    logs = cp.cli("logs", "ok-job", check=True).stdout
    for host, rank in (("algo-1", 0), ("algo-1", 1), ("algo-2", 2), ("algo-2", 3)):
        assert f"[{host} rank {rank}] contract ok=True host={host} rank={rank} world=4" in logs
    assert "CONTRACT PROBLEM" not in logs


def test_nonzero_exit_fails_the_job_with_the_exit_code(cp, tmp_path):
    r = cp.cli(
        "submit", contract_spec(tmp_path, "exit-three", ["--exit-code", "3"], retry={"max_restarts": 0}), "--follow"
    )
    assert r.returncode == 1
    job = cp.job("exit-three")
    assert job["state"] == "Failed"
    assert job["reason"]["kind"] == "exit.nonzero"
    failed = [
        e
        for e in cp.events("exit-three")
        if e["detail-type"] == "Aerie Attempt State Change" and e["detail"]["state"] == "Failed"
    ]
    assert len(failed) == 1
    assert failed[0]["detail"]["reason"]["kind"] == "exit.nonzero"
    assert failed[0]["detail"]["exit_code"] == 3
    assert failed[0]["detail"]["reason"]["exit_code"] == 3
    assert "Failed" in cp.cli("describe", "exit-three", check=True).stdout


def test_control_plane_killed_mid_job_readopts_it(cp, tmp_path):
    cp.cli("submit", contract_spec(tmp_path, "survivor", ["--steps", "8", "--sleep", "1"]), check=True)
    cp.wait_state("survivor", {"InProgress"})
    deadline = time.time() + 60
    while not _all_nodes_running(cp.job("survivor")):
        assert time.time() < deadline
        time.sleep(0.3)
    cp.kill9()
    time.sleep(2)
    cp.start()
    job = cp.wait_state("survivor", {"Completed", "Failed"})
    assert job["state"] == "Completed", job
    assert len(job["attempt_list"]) == 1
    story = event_story(cp.events("survivor"))
    assert story == FIRST_ATTEMPT_STORY
    # The nodes really ran once: one contract line per rank in the logs.
    logs = cp.cli("logs", "survivor", check=True).stdout
    assert logs.count("contract ok=True") == 4


def test_stop_kills_the_whole_tree(cp, tmp_path):
    cp.cli("submit", contract_spec(tmp_path, "to-stop", ["--steps", "600", "--sleep", "1"]), check=True)
    deadline = time.time() + 60
    while not _all_nodes_running(cp.job("to-stop")):
        assert time.time() < deadline
        time.sleep(0.5)
    time.sleep(2)  # let torchrun start the ranks
    cp.cli("stop", "to-stop", check=True)
    job = cp.wait_state("to-stop", {"Stopped", "Failed", "Completed"}, timeout_s=60)
    assert job["state"] == "Stopped"
    time.sleep(1)
    leftovers = []
    for p in psutil.process_iter(["environ"]):
        try:
            if str((p.info.get("environ") or {}).get("AERIE_JOB", "")) == job["id"]:
                leftovers.append(p.pid)
        except psutil.Error:
            pass
    assert leftovers == []


def test_no_secret_reaches_any_log(cp, tmp_path):
    """Tokens (admin, agent, service) never appear in the control plane's or any node's output."""
    r = cp.cli("submit", contract_spec(tmp_path, "quiet", ["--steps", "2"]), "--follow")
    assert r.returncode == 0, r.stdout + r.stderr
    logs = [cp.log] + list(cp.home.glob("jobs/**/node.log"))
    text = "\n".join(p.read_text(errors="replace") for p in logs) + r.stdout + r.stderr
    assert cp.token not in text
    for prefix in ("aer_adm_", "aer_age_", "aer_ser_", "aer_mem_"):
        assert prefix not in text, f"a {prefix}* token leaked into the logs"
