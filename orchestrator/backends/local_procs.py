"""A local node's process tree, seen from its pid files: is its agent alive, and signal it.

The agents run in sessions of their own and outlive the control plane, so all it has of them is
what they wrote in their node's `agent/` folder (`agent.pid`, `trainer.pgid`, `entrypoint.pgid`,
`ranks/rank-N.pid`). Pids are reused: every check also asks the process who it is. Fencing (SIGKILL
of every process a node has, found every way) is `local_fence`'s.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import psutil

from aerie_contracts import env as aerie_env


def read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def agent_gone(pid_file: Path) -> bool:
    """A node whose agent wrote its pid and is gone (not one still starting)."""
    pid = read_pid(pid_file)
    return pid is not None and not alive(pid, "agent")


def alive(pid: int, needle: str) -> bool:
    """True if `pid` runs and is ours (pids are reused: check the command line too)."""
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        cmdline = proc.cmdline()
        # Empty while the process is still in exec (a loaded host's just-started node): starting, not gone.
        return not cmdline or any(needle in part for part in cmdline)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def is_rank_of(pid: int, ml_root: Path) -> bool:
    """True if `pid` runs a rank of the node at `ml_root` (its contract environment says so: a pid
    file alone could name a reused pid)."""
    try:
        proc = psutil.Process(pid)
        return proc.status() != psutil.STATUS_ZOMBIE and proc.environ().get(aerie_env.ML_ROOT) == str(ml_root)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def signal_node(ml_root: Path, sig: int) -> None:
    """Signal the node's agent; on SIGKILL also what it can't stop itself then: torchrun's process
    group, and each rank (torchrun puts every worker in a session of its own)."""
    pid = read_pid(ml_root / "agent" / "agent.pid")
    if pid is not None and alive(pid, "agent"):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
    if sig == signal.SIGKILL:
        for name in ("trainer.pgid", "entrypoint.pgid"):
            pgid = read_pid(ml_root / "agent" / name)
            if pgid:
                try:
                    os.killpg(pgid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        for pid_file in (ml_root / "agent" / "ranks").glob("rank-*.pid"):
            pid = read_pid(pid_file)
            if pid and is_rank_of(pid, ml_root):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
