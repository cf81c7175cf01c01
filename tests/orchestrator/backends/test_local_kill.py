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

from orchestrator.backends.local import _kill_node

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
        _kill_node(node, signal.SIGKILL)
        assert rank.wait(timeout=10) == -signal.SIGKILL
        time.sleep(0.2)
        assert stranger.poll() is None
    finally:
        for proc in (rank, stranger):
            proc.kill()
            proc.wait()
