"""Where a local attempt's pieces live in its handle and folder.

An attempt is a folder (`<jobs>/<job id>/attempt-N/`, the handle's `root`) with one folder per
node; a hot spare a relaunch kept stays in the folder of the attempt that started it, so a node's
folder is looked up here, never joined by hand.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def node_dir(handle: dict[str, Any], host: str) -> Path:
    """A node's folder: under the attempt's, or, for a spare a relaunch kept, under the attempt
    that started it (`node_roots`)."""
    return Path((handle.get("node_roots") or {}).get(host) or handle["root"]) / host


def all_nodes(handle: dict[str, Any]) -> list[str]:
    """The attempt's nodes and its hot spares (one process tree each, stopped together)."""
    return [*handle["hosts"], *handle.get("spares", [])]


def master_addr(handle: dict[str, Any]) -> str:
    """Node rank 0's address (the handle's first host): its network namespace's, else loopback."""
    nodes = (handle.get("netns") or {}).get("nodes") or {}
    return str((nodes.get(handle["hosts"][0]) or {}).get("ip") or "127.0.0.1")
