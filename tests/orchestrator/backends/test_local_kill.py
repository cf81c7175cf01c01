"""The local backend's last resort after a stop's grace: SIGKILL reaches every rank, not only
torchrun's process group (torchrun starts each worker in a session of its own), and never a
process that merely reuses a recorded pid. Real processes and signals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from orchestrator.backends.local_procs import signal_node

HANG = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"


def _spawn(ml_root: Path) -> subprocess.Popen:
    env = dict(os.environ, AERIE_ML_ROOT=str(ml_root))
    return subprocess.Popen([sys.executable, "-c", HANG], env=env, start_new_session=True)


def test_sigkill_reaches_ranks_in_their_own_sessions_and_spares_reused_pids(tmp_path):
    node, other = tmp_path / "attempt-1" / "algo-1", tmp_path / "attempt-9" / "algo-1"
    ranks = node / "agent" / "ranks"
    ranks.mkdir(parents=True)
    rank, stranger = _spawn(node), _spawn(other)
    try:
        (ranks / "rank-1.pid").write_text(str(rank.pid))
        (ranks / "rank-0.pid").write_text(str(stranger.pid))  # as if the pid had been reused
        signal_node(node, signal.SIGKILL)
        assert rank.wait(timeout=10) == -signal.SIGKILL
        time.sleep(0.2)
        assert stranger.poll() is None
    finally:
        for proc in (rank, stranger):
            proc.kill()
            proc.wait()


# A node's launcher: ignores SIGTERM and starts a child with a fresh environment (out of reach of
# the environment scan; a descendant all the same).
LAUNCHER = (
    "import signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "subprocess.Popen([sys.executable, '-c', 'import signal, time; "
    "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)'], env={'PATH': '/usr/bin:/bin'}); "
    "time.sleep(600)"
)


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_fencing_a_lost_node_kills_its_whole_stopped_tree_at_once(tmp_path):
    """Node algo-2 is SIGSTOPped (every process: its launcher, the launcher's fresh-environment
    child, and a worker in a session of its own, like torchrun's); fencing it SIGKILLs them all at
    once, without waiting for a grace period, while algo-1 only gets the usual SIGTERM."""
    from orchestrator.backends.local import LocalBackend

    root = tmp_path / "attempt-1"
    lost, healthy = root / "algo-2", root / "algo-1"
    (lost / "agent" / "ranks").mkdir(parents=True)
    (healthy / "agent").mkdir(parents=True)
    env = dict(os.environ, AERIE_ML_ROOT=str(lost))
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER], env=env, start_new_session=True)
    worker = _spawn(lost)
    bystander = _spawn(healthy)
    try:
        (lost / "agent" / "entrypoint.pid").write_text(str(launcher.pid))
        (lost / "agent" / "ranks" / "rank-1.pid").write_text(str(worker.pid))
        deadline = time.time() + 10
        while not psutil.Process(launcher.pid).children():
            assert time.time() < deadline
            time.sleep(0.05)
        tree = [psutil.Process(launcher.pid), *psutil.Process(launcher.pid).children(), psutil.Process(worker.pid)]
        for proc in tree:
            proc.suspend()  # SIGSTOP
        # Delivered asynchronously, and only once a process leaves an uninterruptible sleep (a
        # loaded CI host held the launcher in `disk-sleep` for over 5 s): a wait, not a measure.
        deadline = time.time() + 30
        while not all(p.status() == psutil.STATUS_STOPPED for p in tree):
            assert time.time() < deadline, [(p.pid, p.status()) for p in tree]
            time.sleep(0.02)

        LocalBackend(tmp_path).fence({"root": str(root), "hosts": ["algo-1", "algo-2"]}, ["algo-2"])
        deadline = time.time() + 3
        while not all(_gone(p.pid) for p in tree):
            assert time.time() < deadline, [(p.pid, p.status()) for p in tree if not _gone(p.pid)]
            time.sleep(0.05)
        assert launcher.wait(5) == -signal.SIGKILL and worker.wait(5) == -signal.SIGKILL
        assert bystander.poll() is None  # SIGTERM only (which it ignores): the stop's grace applies
        assert (root / "stop.json").exists()
    finally:
        for proc in (launcher, worker, bystander):
            proc.kill()
            proc.wait()
