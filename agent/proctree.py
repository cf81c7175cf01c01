"""The node's rank process tree: the agent adopts orphans (a child subreaper) and kills the whole
tree, whatever sessions torchrun put its workers in."""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys

import psutil

log = logging.getLogger("aerie.agent")

PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h


def kill_tree(pid: int, spare: int | None = None) -> list[psutil.Process]:
    """SIGKILL the rank tree: the rank command's process group (`pid`, torchrun's), and every
    descendant of this process whatever its session (torchrun puts each worker in a session of its
    own, out of reach of the killpg). This process has no children but the rank tree and, with
    `spare`, the tree rooted there (the next group warming up: agent.warm), which is left alone.
    Returns the processes signalled, except the rank command itself (which its Popen reaps)."""
    killpg(pid, signal.SIGKILL)
    try:
        tree = psutil.Process().children(recursive=True)
        if spare is not None:
            keep = {spare, *(p.pid for p in psutil.Process(spare).children(recursive=True))}
            tree = [p for p in tree if p.pid not in keep]
    except psutil.Error:
        return []
    _kill(tree)
    return [proc for proc in tree if proc.pid != pid]


def become_subreaper() -> None:
    """Adopt orphaned descendants instead of letting init adopt them.

    When the grace runs out the agent SIGKILLs torchrun, which then cannot stop its workers; a
    worker that ignores SIGTERM (a busy hang: exactly what a verdict stops) was adopted by init
    and kept its core or GPU forever after the node reported its end. Adopted by the agent, it
    stays a descendant that `kill_tree` finds and reaps. Linux only (elsewhere: best effort)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        log.warning("cannot become a child subreaper: a rank that ignores SIGTERM may outlive the node")


def killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def kill_subtree(pid: int) -> list[psutil.Process]:
    """SIGKILL `pid` and every descendant of it, whatever their sessions; returns them (to reap)."""
    try:
        root = psutil.Process(pid)
        tree = [root, *root.children(recursive=True)]
    except psutil.Error:
        return []
    _kill(tree)
    return tree


def _kill(procs: list[psutil.Process]) -> None:
    for proc in procs:
        try:
            proc.kill()
        except psutil.Error:
            pass
