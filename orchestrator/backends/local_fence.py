"""Fencing a local node: SIGKILL every process it has, wherever it sits, stopped or not.

A node declared lost may only be paused (SIGSTOP, a debugger, a frozen VM) and come back later as
a zombie of its attempt. SIGTERM would wait, pending, until it resumes and then run its graceful
path (finish a save, commit) — exactly what must not happen — so a lost node gets SIGKILL, which
acts on stopped processes too, and gets it from the control plane: the node's own agent may be
frozen as well.

The node's processes are found three ways, because no single one reaches all of them: the pid files
its launcher wrote (`agent/entrypoint.pid`, `agent/agent.pid`, `agent/ranks/rank-N.pid`), every
process whose environment carries the node's `AERIE_ML_ROOT` (torchrun starts each worker in a
session of its own, out of reach of a process-group kill), and the descendants of all of those (a
child that was given a fresh environment).
"""

from __future__ import annotations

import os
from pathlib import Path

import psutil

from aerie_contracts import env


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _of_node(proc: psutil.Process, root: str) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE and proc.environ().get(env.ML_ROOT) == root
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False


def node_processes(ml_root: Path) -> list[psutil.Process]:
    """Every live process of the node rooted at `ml_root` (see the module's docstring)."""
    root = str(ml_root)
    found: dict[int, psutil.Process] = {}
    node_dir = ml_root / "agent"
    recorded = [node_dir / "entrypoint.pid", node_dir / "agent.pid", *sorted((node_dir / "ranks").glob("rank-*.pid"))]
    for path in recorded:
        pid = _read_pid(path)
        if pid is None:
            continue
        try:
            proc = psutil.Process(pid)
        except psutil.NoSuchProcess:
            continue
        if _of_node(proc, root):  # a recorded pid may have been reused: the environment says whose it is
            found[pid] = proc
    for proc in psutil.process_iter():
        if proc.pid not in found and _of_node(proc, root):
            found[proc.pid] = proc
    for proc in list(found.values()):
        try:
            for child in proc.children(recursive=True):
                found.setdefault(child.pid, child)
        except psutil.NoSuchProcess:
            pass
    me = os.getpid()
    return [p for pid, p in found.items() if pid != me]


def kill_node(ml_root: Path) -> list[int]:
    """SIGKILL every process of the node now (no grace); returns the pids signalled."""
    killed = []
    for proc in node_processes(ml_root):
        try:
            proc.kill()
            killed.append(proc.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return killed
