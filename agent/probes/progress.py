"""Training progress from the ranks' metrics streams (``rank-<R>.jsonl``), tailed incrementally.

Each file's byte offset is remembered, so a tick reads only what was appended since the last
one; a partial last line (the trainer is mid-write) stays buffered until its newline arrives;
files that appear later (ranks start at different times) are picked up on the next poll.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections import deque
from pathlib import Path

_RANK_FILE = re.compile(r"rank-(\d+)\.jsonl$")
_PAUSES = {
    "checkpoint_begin": ("checkpoint", True),
    "checkpoint_end": ("checkpoint", False),
    "eval_begin": ("eval", True),
    "eval_end": ("eval", False),
}


class _Tail:
    __slots__ = ("offset", "partial", "path")

    def __init__(self, path: Path):
        self.path, self.offset, self.partial = path, 0, b""

    def read_lines(self, max_bytes: int) -> list[bytes]:
        try:
            with open(self.path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size < self.offset:  # truncated / replaced: start over
                    self.offset, self.partial = 0, b""
                if size == self.offset:
                    return []
                f.seek(self.offset)
                data = f.read(min(size - self.offset, max_bytes))
        except FileNotFoundError:
            return []
        self.offset += len(data)
        data = self.partial + data
        lines = data.split(b"\n")
        self.partial = lines.pop()  # b"" when the chunk ended on a newline
        return [ln for ln in lines if ln.strip()]


class ProgressProbe:
    """Per rank: training steps ``[t, step, loss, step_s]``, open and closed pause windows."""

    def __init__(self, metrics_dir: Path, maxlen: int = 600, max_bytes_per_tick: int = 8 << 20):
        self.metrics_dir = Path(metrics_dir)
        self.maxlen, self.max_bytes = maxlen, max_bytes_per_tick
        self._tails: dict[int, _Tail] = {}
        self.steps: dict[int, deque[list]] = {}
        self.open: dict[int, dict[str, float]] = {}
        self.pauses: deque[list[float]] = deque(maxlen=50)
        self.last_record: dict[int, dict] = {}
        self.bad_lines = 0

    def _discover(self) -> None:
        try:
            entries = os.listdir(self.metrics_dir)
        except FileNotFoundError:
            return
        for name in entries:
            m = _RANK_FILE.match(name)
            if m and int(m.group(1)) not in self._tails:
                self._tails[int(m.group(1))] = _Tail(self.metrics_dir / name)

    def sample(self) -> list[dict]:
        """Read what was appended since the last call; returns the new records (for traces)."""
        self._discover()
        new: list[dict] = []
        for rank, tail in self._tails.items():
            for line in tail.read_lines(self.max_bytes):
                try:
                    rec = json.loads(line)
                except ValueError:
                    self.bad_lines += 1
                    continue
                if isinstance(rec, dict):
                    rec.setdefault("rank", rank)
                    self.ingest(rec)
                    new.append(rec)
        return new

    def ingest(self, rec: dict) -> None:
        """Fold one metrics record in (also used to replay recorded traces)."""
        rank = int(rec.get("rank", 0))
        t = float(rec.get("t", 0.0))
        event = rec.get("event")
        self.last_record[rank] = rec
        if event in _PAUSES:
            what, begins = _PAUSES[event]
            opened = self.open.setdefault(rank, {})
            if begins:
                opened[what] = t
            elif what in opened:
                self.pauses.append([opened.pop(what), t])
            return
        if event is None and rec.get("step") is not None:
            loss = rec.get("loss")
            if isinstance(loss, str):  # "nan", "inf" written by hand-rolled loggers
                try:
                    loss = float(loss)
                except ValueError:
                    loss = None
            step_s = rec.get("step_s")
            self.steps.setdefault(rank, deque(maxlen=self.maxlen)).append([t, rec["step"], loss, step_s])

    # ------------------------------------------------------------------ views

    def last_step(self) -> int | None:
        last = [s[-1][1] for s in self.steps.values() if s]
        return min(last) if last else None  # the slowest rank's step is the job's step

    def last_step_t(self) -> float | None:
        """When the slowest rank logged its last step (chaining compares it across nodes)."""
        last = [s[-1] for s in self.steps.values() if s]
        if not last:
            return None
        low = min(s[1] for s in last)
        return min(s[0] for s in last if s[1] == low)

    def last_loss(self) -> float | None:
        for rank in sorted(self.steps):
            if self.steps[rank]:
                loss = self.steps[rank][-1][2]
                return loss if isinstance(loss, (int, float)) and math.isfinite(loss) else None
        return None

    def in_pause(self, what: str) -> bool:
        return any(what in o for o in self.open.values())
