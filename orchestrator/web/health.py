"""Per-node health over time for the dashboard, sampled from heartbeats the API already receives.

Bounded by construction: at most one point per node every `every_s` seconds, `points` points per
node, `max_nodes` nodes (the oldest forgotten first). It lives in the API process's memory and
writes nothing, so the heartbeat path (thousands a second) pays one dict lookup and a clock read
per heartbeat; the cost is that the history starts afresh when the process restarts and, with
several API processes, each holds the heartbeats it received.
"""

from __future__ import annotations

import os
import time
from collections import deque
from typing import Any

from aerie_contracts import env

FIELDS = ("t", "util", "mem", "rx", "tx", "gap")  # gap: longest time between heartbeats since the last point


class NodeHistory:
    def __init__(self, every_s: float | None = None, points: int = 360, max_nodes: int = 20_000):
        self.every_s = float(os.environ.get(env.WEB_HEALTH_EVERY_S, 10.0)) if every_s is None else every_s
        self.points = points
        self.max_nodes = max_nodes
        # (attempt, host) -> [last heartbeat time, last point time, longest gap since, deque of points]
        self._nodes: dict[tuple[str, str], list[Any]] = {}

    def add(self, attempt_id: str, host: str, summary: dict[str, Any]) -> None:
        """Called for every heartbeat: cheap unless a point is due."""
        now = time.time()
        state = self._nodes.get((attempt_id, host))
        if state is None:
            if len(self._nodes) >= self.max_nodes:
                self._nodes.pop(next(iter(self._nodes)))
            state = self._nodes[(attempt_id, host)] = [now, 0.0, 0.0, deque(maxlen=self.points)]
        gap = now - state[0]
        state[0] = now
        if gap > state[2]:
            state[2] = gap
        if now - state[1] < self.every_s:
            return
        state[1] = now
        try:
            state[3].append(_point(now, summary, state[2]))
        except (TypeError, ValueError, AttributeError, OverflowError):  # a malformed summary: no point
            pass
        state[2] = 0.0

    def series(self, attempt_ids: list[str]) -> dict[str, list[tuple]]:
        """host -> points (FIELDS) over the given attempts, in time order."""
        out: dict[str, list[tuple]] = {}
        for (attempt_id, host), state in list(self._nodes.items()):
            if attempt_id in attempt_ids:
                out.setdefault(host, []).extend(list(state[3]))
        for points in out.values():
            points.sort(key=lambda p: p[0])
        return out


def _point(now: float, summary: dict[str, Any], gap: float) -> tuple:
    accels = [a for a in summary.get("accelerators") or [] if isinstance(a, dict)]
    utils = [float(a["util"]) for a in accels if isinstance(a.get("util"), (int, float))]
    mems = [float(a["mem_used"]) for a in accels if isinstance(a.get("mem_used"), (int, float))]
    nics = [n for n in summary.get("nics") or [] if isinstance(n, dict)]
    rx = sum(float(n["rx_bps"]) for n in nics if isinstance(n.get("rx_bps"), (int, float)))
    tx = sum(float(n["tx_bps"]) for n in nics if isinstance(n.get("tx_bps"), (int, float)))
    return (
        round(now, 1),
        sum(utils) / len(utils) if utils else None,
        sum(mems) if mems else None,
        rx if nics else None,
        tx if nics else None,
        round(gap, 2),
    )
