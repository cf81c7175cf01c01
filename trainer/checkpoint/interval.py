"""`checkpoint.every_steps: auto`: S3 saves at the Young–Daly interval the run measures for itself.

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
