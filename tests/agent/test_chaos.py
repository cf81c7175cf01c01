"""`aerie chaos` on the node: the agent does the fault to the real rank process (agent/chaos.py)."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil
import pytest

from aerie_contracts import byo
from agent.chaos import apply_pending


@pytest.fixture
def rank_proc(tmp_path):
    procs = []

    def start(rank: int, children: int = 0) -> psutil.Process:
        code = "import subprocess, sys, time\n"
        sleeper = "[sys.executable, '-c', 'import time; time.sleep(60)']"
        code += f"kids = [subprocess.Popen({sleeper}) for _ in range({children})]\n"
        code += "time.sleep(60)\n"
        p = subprocess.Popen([sys.executable, "-c", code])
        procs.append(p)
        (tmp_path / "agent" / "ranks").mkdir(parents=True, exist_ok=True)
        (tmp_path / "agent" / "ranks" / f"rank-{rank}.pid").write_text(str(p.pid))
        proc = psutil.Process(p.pid)
        deadline = time.time() + 10
        while len(proc.children()) < children and time.time() < deadline:
            time.sleep(0.05)
        return proc

    yield start
    for p in procs:
        for c in psutil.Process(p.pid).children(recursive=True) if p.poll() is None else []:
            c.kill()
        p.kill()
        p.wait()


def _status(proc: psutil.Process) -> str:
    deadline = time.time() + 5
    while proc.status() != psutil.STATUS_STOPPED and time.time() < deadline:
        time.sleep(0.05)
    return proc.status()


def test_sigstop_sigkill_and_refusals(tmp_path, rank_proc):
    node_dir = tmp_path / "agent"
    chaos = node_dir / byo.CHAOS_DIR
    chaos.mkdir(parents=True)
    stopped, killed = rank_proc(0), rank_proc(1)
    for i, (rank, fault) in enumerate([(0, "sigstop"), (1, "sigkill"), (7, "sigstop"), (0, "slow-nic")]):
        (chaos / f"r{i}.json").write_text(f'{{"id": "r{i}", "rank": {rank}, "fault": "{fault}"}}')
    answers = {a["id"]: a for a in apply_pending(node_dir, interfaces=("lo",))}
    assert answers["r0"]["ok"] and _status(stopped) == psutil.STATUS_STOPPED
    assert (answers["r1"]["ok"] and killed.wait(5) is not None) or not killed.is_running()
    assert not answers["r2"]["ok"] and "does not run on this node" in answers["r2"]["error"]
    assert not answers["r3"]["ok"] and "network namespace" in answers["r3"]["error"]
