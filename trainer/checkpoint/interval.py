"""How often to checkpoint, measured by the run itself: `checkpoint.every_steps: auto` (S3 saves at
the Young–Daly interval) and `memory_every_steps: auto` (`AutoInterval`: in-memory snapshots as
often as their measured cost allows, within `AUTO_BUDGET` of the step time).

The first save is at step `first_after` (the config's `checkpoint.auto_first_steps`, default 100:
the old fixed default); it measures the save's synchronous stall C (what the loop waited for:
`checkpoint_staged`'s `stall_s`). With the mean step time d so far and the job allocation's MTBF
M, which the control plane passes at launch (`AERIE_CHECKPOINT_MTBF_S`: the fleet's observed MTBF,
else the operator's setting, over the node count), the interval becomes

    √(2·C·M) / d steps   (aerie_contracts.goodput.young_daly)

clamped to [`MIN_STEPS`, `MAX_STEPS`] and never shorter than the save's whole duration (a save
first waits for the upload before it), re-derived at each save. Without an MTBF (a run outside
Aerie) it stays at `first_after`.

A DCP save is collective: every rank must save at the same steps. Each rank's proposal rides the
training loop's per-step all-gather (trainer/train.py), and every rank adopts the largest, at the
same step.
"""

from __future__ import annotations

import logging
import math
import os

from aerie_contracts import env
from aerie_contracts.goodput import young_daly

log = logging.getLogger("trainer.checkpoint")

MIN_STEPS = 1
MAX_STEPS = 1_000_000
MIN_STALL_S = 1e-3  # a save never costs nothing: keeps √(2·C·M) meaningful for a measured 0


def interval_steps(
    stall_s: float, step_s: float, mtbf_s: float, *, save_s: float = 0.0, lo: int = MIN_STEPS, hi: int = MAX_STEPS
) -> int:
    """The Young–Daly interval in steps: √(2·C·MTBF) over the step time, at least the steps a whole
    save takes (so saves never queue), within [lo, hi]."""
    if not step_s > 0 or not mtbf_s > 0:
        raise ValueError(f"step time {step_s} and MTBF {mtbf_s} must be positive")
    steps = round(young_daly(max(stall_s, MIN_STALL_S), mtbf_s) / step_s)
    if save_s > 0 and math.isfinite(save_s):
        steps = max(steps, math.ceil(save_s / step_s))
    return min(max(hi, lo), max(lo, steps))


def mtbf_from_env(environ: dict[str, str] | None = None) -> float | None:
    """`AERIE_CHECKPOINT_MTBF_S`, or None when unset or not a positive number."""
    raw = (os.environ if environ is None else environ).get(env.CHECKPOINT_MTBF_S, "")
    try:
        value = float(raw)
    except ValueError:
        return None
    return value if value > 0 and math.isfinite(value) else None


class YoungDalyInterval:
    """When the next S3 save is due, for `every_steps: auto` (one per rank)."""

    def __init__(self, mtbf_s: float | None, first_after: int = 100, max_steps: int = MAX_STEPS) -> None:
        self.mtbf_s = mtbf_s
        self.first_after = max(1, int(first_after))
        self.max_steps = max(1, int(max_steps))
        self.every = self.first_after  # the agreed interval (all ranks), in steps
        self.last_save: int | None = None
        self.stall_s: float | None = None
        self.save_s = 0.0  # the longest whole save (stall + upload) seen
        self._steps_s, self._steps = 0.0, 0
        self._proposal = 0  # this rank's interval (0: nothing measured yet)
        self._basis: dict[str, float | None] = {"stall_s": None, "save_s": None, "step_s": None, "mtbf_s": mtbf_s}

    @property
    def step_s(self) -> float | None:
        return self._steps_s / self._steps if self._steps else None

    def observe_step(self, seconds: float) -> None:
        if seconds > 0 and math.isfinite(seconds):
            self._steps_s += seconds
            self._steps += 1

    def observe_save(self, step: int, stall_s: float | None) -> None:
        """A save began at `step` (every rank: the same step) and stalled the loop `stall_s`."""
        self.last_save = step
        if stall_s is not None and stall_s >= 0 and math.isfinite(stall_s):
            self.stall_s = stall_s if self.stall_s is None else max(self.stall_s, stall_s)
        self._propose()

    def observe_upload(self, save_s: float | None) -> None:
        """A save finished after `save_s` in all (known later, from the writer thread)."""
        if save_s is not None and save_s > self.save_s and math.isfinite(save_s):
            self.save_s = save_s
            self._propose()

    def _propose(self) -> None:
        d = self.step_s
        if self.mtbf_s is not None and self.stall_s is not None and d:
            self._proposal = interval_steps(self.stall_s, d, self.mtbf_s, save_s=self.save_s, hi=self.max_steps)
            self._basis = {"stall_s": self.stall_s, "save_s": self.save_s or None, "step_s": d, "mtbf_s": self.mtbf_s}

    def proposal(self) -> float:
        """What this rank would save every (steps; 0 until measured): the loop's all-gather carries it."""
        return float(self._proposal)

    def adopt(self, agreed: float) -> int | None:
        """The largest proposal of all ranks, the same on each; the new interval if it changed."""
        steps = int(agreed)
        if steps < 1 or steps == self.every:
            return None
        self.every = steps
        return steps

    def due(self, step: int) -> bool:
        if self.last_save is None:
            return step >= self.first_after
        return step - self.last_save >= self.every

    def describe(self) -> dict[str, float | int | None]:
        """The agreed interval, and what this rank's proposal came from (the `checkpoint_interval`
        metrics event): its stall, longest whole save, mean step time then, and the MTBF."""
        basis = self._basis
        d = basis["step_s"]
        return {"every_steps": self.every, "interval_s": self.every * d if d else None, **basis}


# --- the memory tier: `memory_every_steps` -----------------------------------------------------
# The budget: snapshots may cost at most this share of the training time.
AUTO_BUDGET = 0.01


def parse_every(value: str | int | None) -> int | None:
    """`AERIE_MEMORY_CHECKPOINT_EVERY`: a positive step count, `auto` (None here), or 0/empty (off: 0)."""
    if value is None or value == "":
        return 0
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"memory_every_steps {value}: 0 (off), a positive step count or 'auto'")
        return value
    text = str(value).strip().lower()
    if text == "auto":
        return None
    if not text.isdigit():
        raise ValueError(f"memory_every_steps {value!r}: 0 (off), a positive step count or 'auto'")
    return int(text)


class AutoInterval:
    """`memory_every_steps: auto`: snapshot as often as the measured cost allows within `budget`.

    With a snapshot costing `c` seconds (the rank is blocked for it) and a step taking `t`, taking
    one every `k` steps costs `c / (k t)` of the time; the smallest `k` within the budget is
    ceil(c / (budget t)). Both are smoothed (EMA) and the interval re-derived after each snapshot.
    The first snapshot is taken at step `first_after`: it measures c.

    Every rank must snapshot the same steps (a memory checkpoint needs all of them), so the
    interval changes only at a snapshot, from values the ranks agreed on there
    (`MemorySnapshotter.snapshot` all-reduces them); between snapshots, step times only accumulate.
    """

    def __init__(self, budget: float = AUTO_BUDGET, first_after: int = 2, smoothing: float = 0.3) -> None:
        if not 0 < budget < 1:
            raise ValueError(f"budget {budget}: a fraction in (0, 1)")
        self.budget = budget
        self.first_after = max(1, first_after)
        self.smoothing = smoothing
        self.step_s: float | None = None
        self.snapshot_s: float | None = None
        self.last_step: int | None = None
        self._steps_s, self._steps = 0.0, 0  # this rank's step times since the last snapshot

    def _ema(self, old: float | None, new: float) -> float:
        return new if old is None else (1 - self.smoothing) * old + self.smoothing * new

    def observe_step(self, seconds: float) -> None:
        if seconds > 0 and math.isfinite(seconds):
            self._steps_s += seconds
            self._steps += 1

    def local_step_s(self) -> float:
        """The mean step time since the last snapshot, as this rank saw it (0: none yet)."""
        return self._steps_s / self._steps if self._steps else 0.0

    def observe_snapshot(self, step: int, seconds: float, step_s: float | None = None) -> None:
        """A snapshot at `step` cost `seconds`; `step_s` the steps' mean time (the ranks' agreed
        values; default this rank's own)."""
        step_s = self.local_step_s() if step_s is None else step_s
        self.last_step = step
        if seconds >= 0 and math.isfinite(seconds):
            self.snapshot_s = self._ema(self.snapshot_s, seconds)
        if step_s > 0 and math.isfinite(step_s):
            self.step_s = self._ema(self.step_s, step_s)
        self._steps_s, self._steps = 0.0, 0

    def every(self) -> int | None:
        """The interval in steps, once both costs are known."""
        if self.step_s is None or self.snapshot_s is None:
            return None
        return max(1, math.ceil(self.snapshot_s / (self.budget * self.step_s)))

    def due(self, step: int) -> bool:
        if self.last_step is None:
            return step >= self.first_after
        every = self.every()
        return step - self.last_step >= (every if every is not None else self.first_after)
