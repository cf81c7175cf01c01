"""Progress from a trainer's TensorBoard event files: scalars in, metrics-stream records out.

`TensorBoardProgress` tails a directory tree (the spec's `metrics.tensorboard.dir`) once per agent
tick. Every event file in it (`*tfevents*`, run subdirectories included: HF's `runs/<date>_<host>`,
torchtitan's `tb/<date>`) is read with TensorBoard's own loader, which keeps its offset between
polls and stops before a record still being written, resuming there once the rest is on disk. A
file that appears later (a restarted writer opens a new one) is picked up on the next poll; no
directory, or an empty one, yields nothing. Files last written before the tail started (an earlier
run's, in a directory that outlives attempts) are skipped.

Scalars whose tag is mapped (`byo.TB_TAGS`, then the spec's `tags`) become one record per step,
`{"t": the event's wall time, "rank", "step": the event's step, <key>: value, ..., "event": null,
"source": "tensorboard"}`, appended to the writer rank's `rank-<R>.jsonl`, so the progress probe,
the detectors and the metrics forwarding take them like any other record. Each (step, key) is
written once: the newest step read waits one poll (a flush may be on disk in part), and scalars
of a step that land later still add a record with only the new keys.
Unmapped tags (eval curves, histograms, text) are ignored.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

from aerie_contracts import byo
from aerie_contracts import metrics as keys
from aerie_contracts.container import node_path

log = logging.getLogger("aerie.agent")

MAX_EVENTS_PER_POLL = 50_000  # a tick stays short; the rest is read on the next one
_REMEMBERED_STEPS = 4096  # (step, key) pairs already written, for the newest steps


def event_files(root: Path) -> list[Path]:
    """Every TensorBoard event file under `root`, in name order within each directory."""
    found: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        found.extend(Path(dirpath) / n for n in sorted(filenames) if "tfevents" in n)
    return found


def scalar_of(value: Any) -> float | None:
    """A summary value's number: a legacy `simple_value`, or a one-element tensor (what TensorBoard's
    compat layer turns scalars into). None for anything else (an image, a histogram, text)."""
    if value.HasField("simple_value"):
        return float(value.simple_value)
    if not value.HasField("tensor"):
        return None
    from tensorboard.util import tensor_util

    try:
        array = tensor_util.make_ndarray(value.tensor)
    except (ValueError, TypeError):
        return None
    if array.size != 1 or array.dtype.kind not in "fiub":
        return None
    return float(array.reshape(()))


class TensorBoardProgress:
    """One node's tail of one TensorBoard directory. `poll()` appends and returns new records."""

    def __init__(
        self,
        directory: Path,
        metrics_dir: Path,
        tags: dict[str, str] | None = None,
        rank: int = 0,
        since: float | None = None,
    ):
        # Imported here: the agent needs tensorboard only when a spec asks for this source.
        from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

        self._loader_class = EventFileLoader
        self.directory, self.rank, self.since = Path(directory), rank, since
        self.path = Path(metrics_dir) / f"rank-{rank:05d}.jsonl"
        self.tags = {**byo.TB_TAGS, **(tags or {})}
        self._loaders: dict[Path, Any] = {}
        self._skipped: set[Path] = set()
        self._written: OrderedDict[int, set[str]] = OrderedDict()
        self._held: dict[int, tuple[float, dict[str, float]]] = {}  # the newest step, for one poll
        self.errors = 0

    @classmethod
    def from_env(
        cls, value: str | None, ml_root: Path, metrics_dir: Path, rank: int, since: float | None = None
    ) -> TensorBoardProgress | None:
        """From `AERIE_LOG_METRICS`; None when it asks for no TensorBoard source. Raises ValueError
        for a malformed setting, ImportError when tensorboard is not installed."""
        if not value:
            return None
        try:
            cfg = json.loads(value).get("tensorboard")
        except (ValueError, AttributeError):
            return None
        if cfg is None:
            return None
        tb = byo.validate_tensorboard(cfg)
        return cls(node_path(tb["dir"], ml_root), metrics_dir, tb["tags"], rank=rank, since=since)

    def poll(self, now: float | None = None, final: bool = False) -> list[dict[str, Any]]:
        """Read what was written since the last poll; never raises (a bad file is counted, skipped).
        `final`: the trainer is done, nothing is held back for the next poll."""
        now = time.time() if now is None else now
        try:
            records = self._records(self._read(), now, final)
        except Exception:  # a reader bug must never take the agent's tick down
            log.exception("reading TensorBoard events under %s failed", self.directory)
            self.errors += 1
            return []
        if records:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                with open(self.path, "a") as f:
                    f.write("".join(json.dumps(r) + "\n" for r in records))
            except OSError as exc:
                log.warning("cannot append TensorBoard progress to %s: %s", self.path, exc)
                return []
        return records

    def _discover(self) -> None:
        for path in event_files(self.directory):
            if path in self._loaders or path in self._skipped:
                continue
            try:
                if self.since is not None and path.stat().st_mtime < self.since:
                    self._skipped.add(path)  # an earlier run's file: its steps are not this run's
                    continue
                self._loaders[path] = self._loader_class(str(path))
            except OSError:
                continue  # gone between the listing and the open (a rotated file): next poll

    def _read(self) -> dict[int, tuple[float, dict[str, float]]]:
        """{step: (latest wall time, {key: value})} of the mapped scalars read in this poll."""
        self._discover()
        steps: dict[int, tuple[float, dict[str, float]]] = {}
        budget = MAX_EVENTS_PER_POLL
        for path, loader in self._loaders.items():
            try:
                for event in loader.Load():  # stops at the end, or before a partial last record
                    budget -= 1
                    self._fold(event, steps)
                    if budget <= 0:
                        return steps
            except Exception as exc:  # an unreadable file: count it, the others still count
                self.errors += 1
                log.warning("TensorBoard event file %s: %s", path, exc)
        return steps

    def _fold(self, event: Any, steps: dict[int, tuple[float, dict[str, float]]]) -> None:
        if not event.HasField("summary") or event.step < 0:
            return
        for value in event.summary.value:
            key = self.tags.get(value.tag)
            if key is None:
                continue
            number = scalar_of(value)
            if number is None:
                continue
            t, values = steps.get(event.step, (0.0, {}))
            values[key] = number  # NaN/inf stay: loss.nan must see them
            steps[event.step] = (max(t, event.wall_time), values)

    def _records(
        self, steps: dict[int, tuple[float, dict[str, float]]], now: float, final: bool
    ) -> list[dict[str, Any]]:
        # The newest step read in this poll waits one poll: a writer's flush may be on disk in part
        # (its other scalars follow), and a step is best counted once, whole. It goes out at the next
        # poll that reads nothing more of it, or at the last one (`final`).
        pending = self._held
        for step, (wall, values) in steps.items():
            t0, old = pending.get(step, (0.0, {}))
            pending[step] = (max(t0, wall), {**old, **values})
        newest = max(steps) if steps and not final else None
        self._held = {newest: pending.pop(newest)} if newest is not None else {}
        out = []
        for step, (wall, values) in sorted(pending.items()):
            written = self._written.setdefault(step, set())
            self._written.move_to_end(step)
            new = {k: v for k, v in values.items() if k not in written}
            if not new:
                continue
            written.update(new)
            # The step happened when the trainer wrote it, not when the agent read it: gaps between
            # steps stay step times, however the writer batches its flushes.
            t = wall if wall > 0 and math.isfinite(wall) else now
            rec: dict[str, Any] = {keys.T: t, keys.RANK: self.rank, keys.STEP: step, **new, keys.EVENT: None}
            out.append({**rec, byo.SOURCE_KEY: byo.SOURCE_TENSORBOARD})
        while len(self._written) > _REMEMBERED_STEPS:
            self._written.popitem(last=False)
        return out
