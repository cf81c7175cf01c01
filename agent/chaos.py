"""Faults from the outside (`aerie chaos`): the agent does them to its real rank processes.

The control plane hands a request to the node (the local backend: `<node dir>/chaos/<id>.json`);
the agent picks it up on its next tick, acts on the rank's real pid (`ranks/rank-<R>.pid`, written
by `agent.rank`, not torchrun's or the wrapper's), and answers in `<id>.done.json`. Any trainer can
be rehearsed this way, unchanged; Aerie's own trainer keeps its in-process faults (`AERIE_FAULTS`).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import psutil

from aerie_contracts import byo

log = logging.getLogger("aerie.agent")
SLOW_NIC = ["netem", "delay", "200ms", "rate", "1mbit"]


def apply_pending(node_dir: Path, interfaces: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """Do every pending request once; returns the answers written."""
    directory = Path(node_dir) / byo.CHAOS_DIR
    answers = []
    for path in sorted(directory.glob("*.json")) if directory.is_dir() else []:
        if path.name.endswith(".done.json"):
            continue
        try:
            request = json.loads(path.read_text())
            result = apply(node_dir, request, interfaces)
        except Exception as exc:  # a bad request must never take the agent down
            request, result = {"id": path.stem}, {"ok": False, "error": str(exc)}
        answer = {**request, **result, "done_at": time.time()}
        (directory / f"{path.stem}.done.json").write_text(json.dumps(answer))
        path.unlink(missing_ok=True)
        log.warning("chaos %s on rank %s: %s", request.get("fault"), request.get("rank"), result)
        answers.append(answer)
    return answers


def apply(node_dir: Path, request: dict[str, Any], interfaces: tuple[str, ...] = ()) -> dict[str, Any]:
    fault, rank = request.get("fault"), request.get("rank")
    if fault not in byo.CHAOS_FAULTS:
        return {"ok": False, "error": f"unknown fault {fault!r}"}
    if fault == byo.FAULT_NODE_LOSS:  # the agent is one of its victims: the backend does it
        return {"ok": False, "error": "node-loss is done by the backend, not by the node's agent"}
    if fault == byo.FAULT_SLOW_NIC:
        nic = next((i for i in interfaces if i != "lo"), None)
        if nic is None:
            return {"ok": False, "error": "slow-nic needs the node in a network namespace (backend_options.netns)"}
        r = subprocess.run(["tc", "qdisc", "replace", "dev", nic, "root", *SLOW_NIC], capture_output=True, text=True)
        return {"ok": r.returncode == 0, "nic": nic, **({"error": r.stderr.strip()} if r.returncode else {})}
    try:
        pid = int((Path(node_dir) / "ranks" / f"rank-{int(rank)}.pid").read_text())  # type: ignore[arg-type]
    except (OSError, ValueError, TypeError):
        return {"ok": False, "error": f"rank {rank} does not run on this node"}
    if fault == byo.FAULT_FREEZE:
        procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
        for p in procs:
            p.send_signal(signal.SIGSTOP)
        return {"ok": True, "pids": [p.pid for p in procs]}
    os.kill(pid, signal.SIGSTOP if fault == byo.FAULT_SIGSTOP else signal.SIGKILL)
    return {"ok": True, "pids": [pid]}
