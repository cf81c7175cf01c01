"""Training progress from the ranks' metrics streams (``rank-<R>.jsonl``), tailed incrementally.

Each file's byte offset is remembered, so a tick reads only what was appended since the last
one; a partial last line (the trainer is mid-write) stays buffered until its newline arrives;
files that appear later (ranks start at different times) are picked up on the next poll.

Sections (`aerie_contracts.health.Section`): `checkpoint_begin` opens a checkpoint *stall* (a pause:
no step runs); `checkpoint_staged` closes it and opens the *upload*, which runs beside the steps
and is not a pause; `checkpoint_end` closes whichever is open (a writer without `staged` has its
whole save as a stall); `train_end` (the rank's last step is done) opens its *wind-down* (a final
save, an export, the teardown), which the rank's exit ends; `checkpoint_wait` (the loop blocks on
the in-flight upload) opens an `upload_wait` pause that the upload's end closes.
`eval_begin`/`eval_end` bound an eval pause. Each closed section's duration is kept (`durations`),
so the agent learns its timeouts and reports them in heartbeats.

TensorBoard records (`"source": "tensorboard"`, agent/tb_progress.py) reach disk only when the
trainer's writer flushes, usually after its log lines did: they only ever move a rank forward. One
whose step is not beyond the rank's last step is no new step when either of the two came from
TensorBoard (a step is counted once, from whichever source gave it first); a same-step TensorBoard
record after a TensorBoard step only fills in a loss that step lacked. Log lines, `aerie_report`
and Aerie's own trainer are taken as they come, as before.

Several sources, one rank (issue #33: the in-process probe, `"source": "probe"`, beside a log
preset or a trainer that writes the stream itself): each source's last step is kept per (rank,
source), and the rule is simple:

- the rank's step never goes backwards: a record whose step is below the rank's last one (a
  source that numbers steps its own way, a progress bar whose total changed) is kept at the rank's
  last step; the step shown is the highest any source gave;
- a probe record is a new step (liveness) whenever it changes its own source's count, whatever
  the other sources said: it is one record per optimizer step; the same probe step again is not;
- once a rank has probe records, another source's record is a new step only beyond the rank's last
  step; at or below it, it only fills in a loss the last step lacked (the probe already counted
  the step; counting it twice would halve the step time the hang limit is learned from).
"""

from __future__ import annotations

import json
import math
import os
import re
from collections import deque
from pathlib import Path
from statistics import median
from typing import Any

from aerie_contracts import byo
from aerie_contracts import metrics as keys
from aerie_contracts.health import LEARNED_SAMPLES, SUMMARY_COMPUTE_P50, SUMMARY_WAIT_P50, Section
from aerie_contracts.metrics import MetricEvent

TIMING_STEPS = 10  # steps per rank whose compute/wait medians the heartbeat reports
_RANK_FILE = re.compile(r"rank-(\d+)\.jsonl$")
# Pause names in `open` (a window's evidence shows them): a checkpoint's stall, an eval, and the
# loop blocked on an in-flight upload (`checkpoint_wait`, bounded by the upload's own limit).
CHECKPOINT, EVAL, UPLOAD_WAIT, WIND_DOWN = "checkpoint", "eval", "upload_wait", "wind_down"
_PAUSE_SECTION = {CHECKPOINT: Section.CHECKPOINT_STALL, EVAL: Section.EVAL, WIND_DOWN: Section.WIND_DOWN}


def _number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _non_finite(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and not math.isfinite(x)


def _finite(x: object) -> bool:
    return _number(x) and math.isfinite(x)  # type: ignore[arg-type]


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
        self.uploads: dict[int, float] = {}  # rank -> when its open upload started
        self.durations: dict[str, deque[float]] = {}  # section -> newest closed durations
        self.first_step_t: float | None = None
        self.timing: dict[int, deque[tuple[float, float]]] = {}  # rank -> recent (compute_s, wait_s)
        self.first_nan: dict[int, dict] = {}  # rank -> its first step with a non-finite loss
        self.last_source: dict[int, str | None] = {}  # rank -> the source of its last step
        self.repeated = 0  # TensorBoard/other-source records for a step already counted
        self.source_step: dict[tuple[int, str | None], object] = {}  # (rank, source) -> its last step

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
                    if self.ingest(rec):
                        new.append(rec)
        return new

    def ingest(self, rec: dict) -> bool:
        """Fold one metrics record in (also used to replay recorded traces). False: a step that
        another source already gave (see the module's docstring), left out."""
        rank = int(rec.get(keys.RANK, 0))
        t = float(rec.get(keys.T, 0.0))
        event = rec.get(keys.EVENT)
        self.last_record[rank] = rec
        if event is not None:
            self._event(rank, t, str(event))
            return True
        if rec.get(keys.STEP) is not None:
            loss = rec.get(keys.LOSS)
            if isinstance(loss, str):  # "nan", "inf" written by hand-rolled loggers
                try:
                    loss = float(loss)
                except ValueError:
                    loss = None
            seen = self._seen_step(rank, rec, loss)
            if seen is not None:
                self.repeated += not seen
                return seen
            self.last_source[rank] = rec.get(byo.SOURCE_KEY)
            step = rec[keys.STEP]
            # A later step after `train_end` (a bar's total was not the run's): no wind-down after all.
            # (The last step again is not: HF's logs dict of the last step may follow its bar.)
            last = self.steps.get(rank)
            if last and _number(step) and _number(last[-1][1]):
                if step > last[-1][1]:
                    self.open.get(rank, {}).pop(WIND_DOWN, None)
                step = max(step, last[-1][1])  # a source going backwards is not the rank going backwards
            step_s = rec.get(keys.STEP_S)
            self.steps.setdefault(rank, deque(maxlen=self.maxlen)).append([t, step, loss, step_s])
            if self.first_step_t is None or t < self.first_step_t:
                self.first_step_t = t
            if rank not in self.first_nan and _non_finite(loss):
                self.first_nan[rank] = {
                    k: rec.get(k) for k in (keys.STEP, keys.LOSS, keys.LOCAL_LOSS, keys.CONSUMED_SAMPLES)
                }
            compute, wait = rec.get(keys.COMPUTE_S), rec.get(keys.WAIT_S)
            if isinstance(compute, (int, float)) and isinstance(wait, (int, float)):
                self.timing.setdefault(rank, deque(maxlen=TIMING_STEPS)).append((float(compute), float(wait)))
        return True

    def _seen_step(self, rank: int, rec: dict, loss: object) -> bool | None:
        """None: a new step. Else the rank already has it (from TensorBoard or followed by it, from
        the probe, or the probe's same step again: the module's docstring): True when the record
        filled in the step's loss, False when it adds nothing."""
        source, step = rec.get(byo.SOURCE_KEY), rec[keys.STEP]
        before = self.source_step.get((rank, source))
        self.source_step[(rank, source)] = step
        series = self.steps.get(rank)
        if not series:
            return None
        if source == byo.SOURCE_PROBE:
            return False if before is not None and step == before else None
        if (rank, byo.SOURCE_PROBE) in self.source_step:
            last_step = series[-1][1]
            if not (_number(step) and _number(last_step)) or step > last_step:
                return None
            if series[-1][2] is None and loss is not None:
                series[-1][2] = loss  # the probe's step had no loss (a device's not yet read): the log's
                if rank not in self.first_nan and _non_finite(loss):
                    self.first_nan[rank] = {keys.STEP: last_step, keys.LOSS: loss}
                return True
            return False
        last = self.last_source.get(rank)
        if byo.SOURCE_TENSORBOARD not in (source, last):
            return None
        step, last_step = rec[keys.STEP], series[-1][1]
        if source == last == byo.SOURCE_TENSORBOARD and step == last_step and series[-1][2] is None:
            if loss is None:
                return False
            series[-1][2] = loss  # the step's loss landed in a later flush than its other scalars
            if rank not in self.first_nan and _non_finite(loss):
                self.first_nan[rank] = {keys.STEP: step, keys.LOSS: loss}
            return True
        numbers = all(isinstance(x, (int, float)) for x in (step, last_step))
        return False if numbers and step <= last_step else None

    def _event(self, rank: int, t: float, event: str) -> None:
        opened = self.open.setdefault(rank, {})
        if event in (MetricEvent.CHECKPOINT_BEGIN, MetricEvent.EVAL_BEGIN):
            opened[CHECKPOINT if event == MetricEvent.CHECKPOINT_BEGIN else EVAL] = t
        elif event == MetricEvent.TRAIN_END:
            opened.setdefault(WIND_DOWN, t)
        elif event == MetricEvent.EVAL_END:
            self._close_pause(opened, EVAL, t)
        elif event == MetricEvent.CHECKPOINT_STAGED:
            self._close_pause(opened, CHECKPOINT, t)
            self.uploads[rank] = t
        elif event == MetricEvent.CHECKPOINT_WAIT:
            if rank in self.uploads:  # else the upload already ended (its line came first)
                opened[UPLOAD_WAIT] = t
        elif event == MetricEvent.CHECKPOINT_END:
            if rank in self.uploads:
                self._learn(Section.CHECKPOINT_UPLOAD, t - self.uploads.pop(rank))
                if UPLOAD_WAIT in opened:  # a pause, but the upload's time: not learned as a stall
                    self.pauses.append([opened.pop(UPLOAD_WAIT), t])
            else:
                self._close_pause(opened, CHECKPOINT, t)

    def _close_pause(self, opened: dict[str, float], what: str, t: float) -> None:
        if what in opened:
            t0 = opened.pop(what)
            self.pauses.append([t0, t])
            self._learn(_PAUSE_SECTION[what], t - t0)

    def _learn(self, section: Section, seconds: float) -> None:
        self.durations.setdefault(section.value, deque(maxlen=LEARNED_SAMPLES)).append(max(0.0, seconds))

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

    def rank_steps(self) -> dict[str, dict[str, Any]]:
        """Per rank, its newest step, that step's loss (None unless a finite number) and when. A
        newest step whose loss is not known yet (HF's bar drawn before its logs dict, the probe's
        record still unflushed; a loss still on its device) gives way to the step before it when
        that one has its loss: step and loss always belong together, and the loss is shown."""
        out: dict[str, dict[str, Any]] = {}
        for rank, series in sorted(self.steps.items()):
            if series:
                t, step, loss, _step_s = series[-1]
                if loss is None and len(series) > 1 and _finite(series[-2][2]):
                    t, step, loss, _step_s = series[-2]
                finite = isinstance(loss, (int, float)) and math.isfinite(loss)
                out[str(rank)] = {"step": step, "loss": loss if finite else None, "t": round(t, 3)}
        return out

    def rank_timing(self) -> dict[str, dict[str, float]]:
        """Per rank, the median compute and wait time of its last `TIMING_STEPS` steps."""
        out = {}
        for rank, rows in sorted(self.timing.items()):
            if rows:
                out[str(rank)] = {
                    SUMMARY_COMPUTE_P50: round(median(c for c, _w in rows), 4),
                    SUMMARY_WAIT_P50: round(median(w for _c, w in rows), 4),
                    "n": len(rows),
                }
        return out

    def in_pause(self, what: str) -> bool:
        return any(what in o for o in self.open.values())
