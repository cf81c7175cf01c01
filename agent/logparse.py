"""Progress from a third-party trainer's output: log lines in, metrics-stream records out.

`LogParser` is fed one rank's output segment by segment (a line, or a piece of one between
carriage returns: progress bars redraw with '\\r'); each segment is matched against the preset's
rules and the spec's MetricDefinitions. A segment that yields a step is a step record; one that
yields only metrics is attached to the last step seen (HF's `{'loss': ...}` dict: to the bar that
tqdm redraws right after it), or, when no
rule gives a step at all (SageMaker-style definitions of just a loss), counts steps itself.
Anything that does not match is ignored; a value that is not a number is dropped. Records have
the metrics stream's shape (`{"t", "rank", "step", "loss", ..., "event": None, "source": "log"}`),
so the progress probe and the detectors take them exactly as Aerie's own trainer's. The step that
reaches the run's total (a bar's "N/N", Megatron's "iteration N/ N") is followed by a `train_end`
record: what comes after it is the rank's wind-down, not a hang between steps.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aerie_contracts import byo
from aerie_contracts import metrics as keys
from aerie_contracts.metrics import MetricEvent

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")  # torchtitan colours its metrics line
# tqdm draws a nested bar (position >= 1: HF's evaluation and prediction bars, under the training
# bar) and then moves the cursor back up: such a segment ends in "cursor up". Never the training bar.
_NESTED_BAR_END = "\x1b[A"
_NUM = r"[-+]?(?:\d[\d,]*\.?\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?|nan|inf|NaN|Inf)"

# Named groups: step, total, epoch (+ total: a per-epoch bar), loss, grad_norm, lr, step_ms, tps, mfu.
_PRESET_RULES: dict[str, list[str]] = {
    byo.PRESET_MEGATRON: [
        rf"iteration\s+(?P<step>\d+)\s*/\s*(?P<total>\d+)\s*\|"
        rf"(?:.*?elapsed time per iteration \(ms\):\s*(?P<step_ms>{_NUM}))?"
        rf"(?:.*?learning rate:\s*(?P<lr>{_NUM}))?"
        rf"(?:.*?lm loss:\s*(?P<loss>{_NUM}))?"
        rf"(?:.*?grad norm:\s*(?P<grad_norm>{_NUM}))?",
    ],
    # transformers.Trainer: the training bar on stderr (no description: eval and shard-writing bars
    # have one or a different total) and the logs dict on stdout (values quoted since 5.x).
    byo.PRESET_HF_TRAINER: [
        r"^\s*\d+%\|[^|]*\|\s*(?P<step>\d+)/(?P<total>\d+) \[",
        rf"^\s*\{{'loss': '?(?P<loss>{_NUM})'?"
        rf"(?:.*?'grad_norm': '?(?P<grad_norm>{_NUM})'?)?"
        rf"(?:.*?'learning_rate': '?(?P<lr>{_NUM})'?)?",
    ],
    byo.PRESET_TORCHTITAN: [
        rf"step:\s*(?P<step>\d+)\s+loss:\s*(?P<loss>{_NUM})"
        rf"(?:.*?grad_norm:\s*(?P<grad_norm>{_NUM}))?"
        rf"(?:.*?tps:\s*(?P<tps>{_NUM}))?"
        rf"(?:.*?mfu:\s*(?P<mfu>{_NUM})%)?",
    ],
    # Lightning: its own bars and lines, read by _LightningProgress (a bar counts batches within an
    # epoch, not global steps); this entry only names the preset.
    byo.PRESET_LIGHTNING: [],
}

# Lightning 2.6's output, as it really prints it (tests/agent/test_lightning_preset.py runs it):
# - TQDMProgressBar (no `rich`, or the callback given): "Epoch E:  P%|bar| i/n [.., v_num=0, train_loss=..]"
#   redrawn with '\r' after every batch; a run resumed mid-epoch draws "Training: |  | i/? [..]"
#   for the rest of that epoch (i counts that epoch's batches); the last epoch's n is the steps left.
# - RichProgressBar (the default where `rich` is installed): in a pipe nothing until the end of fit,
#   then one frame "Epoch E/M ━━━ i/n 0:00:01 • 0:00:00 9.8it/s v_num: 0.000" and its metrics on
#   the next line ("train_loss: 0.186"); in a terminal (or TTY_COMPATIBLE=1 / FORCE_COLOR) the same
#   frame redrawn with cursor controls. "`Trainer.fit` stopped: `max_steps=N` reached." comes
#   before it; "Restoring states from the checkpoint path at PATH" opens a resumed run.
_LT_TQDM = re.compile(
    r"^(?:Epoch (?P<epoch>\d+)|(?P<training>Training)):\s+(?:\d+%)?\|[^|]*\|\s*(?P<n>\d+)/(?P<total>\d+|\?) \["
    r"(?P<post>[^\]]*)"
)
_LT_RICH = re.compile(
    r"^(?:Epoch (?P<epoch>\d+)(?:/-?\d+)?|(?P<training>Training))\s+(?:[^\d\s]+\s+)?"
    r"(?P<n>\d+)/(?P<total>\d+|\?)\s+\d+:\d\d:\d\d(?P<post>.*)$"
)
_LT_LOSS_TQDM = re.compile(rf"\b(?:train_)?loss(?:_step)?=(?P<loss>{_NUM})")
_LT_LOSS_RICH = re.compile(rf"(?:^|\s)(?:train_)?loss(?:_step)?: (?P<loss>{_NUM})(?:\s|$)")
_LT_RICH_METRICS = re.compile(rf"^(?:[\w/.-]+: \S+\s+)*?(?:train_)?loss(?:_step)?: (?P<loss>{_NUM})(?:\s|$)")
_LT_STOP = re.compile(r"`Trainer\.fit` stopped: `max_steps=(?P<step>\d+)` reached")
_LT_STOP_ANY = re.compile(r"`Trainer\.fit` stopped: ")
_LT_RESTORE = re.compile(r"^Restoring states from the checkpoint path at (?P<path>.+?)\s*$")
_LT_NAMED_STEP = re.compile(r"(?:^|[-_])step=(\d+)")
_FIELDS = {"loss": "loss", "grad_norm": "grad_norm", "lr": "lr", "tps": "tokens_per_s", "mfu": "mfu"}


def _number(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        value = float(text.replace(",", ""))
    except ValueError:
        return None
    return value


@dataclass
class LogParser:
    """One rank's parser. `feed(text)` returns the records the text completed."""

    rank: int = 0
    preset: str | None = None
    definitions: list[dict] = field(default_factory=list)
    _rules: list[re.Pattern[str]] = field(init=False, repr=False)
    _defs: list[tuple[str, re.Pattern[str]]] = field(init=False, repr=False)
    _step: int | None = field(default=None, init=False)
    _total: int | None = field(default=None, init=False)
    _counted: int = field(default=0, init=False)
    _pending: dict[str, float] | None = field(default=None, init=False)  # HF: metrics awaiting their bar
    _ended: bool = field(default=False, init=False)  # train_end given (the step reached the total)
    errors: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        if self.preset is not None and self.preset not in _PRESET_RULES:
            raise ValueError(f"unknown metrics preset {self.preset!r} (one of {', '.join(byo.PRESETS)})")
        self._rules = [re.compile(r) for r in _PRESET_RULES.get(self.preset or "", [])]
        defs = byo.validate_definitions(list(self.definitions))
        self._defs = [(byo.field_for(d["Name"]), re.compile(d["Regex"])) for d in defs]
        self._lightning = _LightningProgress() if self.preset == byo.PRESET_LIGHTNING else None
        self._steps_given = (
            any(name == "step" for name, _ in self._defs) or bool(self._rules) or self._lightning is not None
        )

    @classmethod
    def from_env(cls, value: str | None, rank: int) -> LogParser | None:
        """From `AERIE_LOG_METRICS`; None when unset, empty, unusable or without log rules (the rank
        runs unparsed)."""
        if not value:
            return None
        try:
            cfg = json.loads(value)
            if not cfg.get("preset") and not cfg.get("definitions"):
                return None  # progress from TensorBoard only (agent.tb_progress): no line to parse
            return cls(rank=rank, preset=cfg.get("preset"), definitions=cfg.get("definitions") or [])
        except (ValueError, TypeError, AttributeError):
            return None

    def feed(self, segment: str, now: float | None = None) -> list[dict[str, Any]]:
        """Records from one output segment; never raises (a bad line is counted and ignored)."""
        try:
            return self._feed(segment, time.time() if now is None else now)
        except Exception:  # a parser bug must never take a rank's output down with it
            self.errors += 1
            return []

    def _feed(self, segment: str, now: float) -> list[dict[str, Any]]:
        text = _ANSI.sub("", segment).strip()
        if not text:
            return []
        if self._lightning is not None:
            got = self._lightning.feed(text)
            if got is not None:
                return self._lightning_records(got, now)
        found: dict[str, Any] = {}
        for rule in self._rules:
            m = rule.search(text)
            if m:
                found.update({k: v for k, v in m.groupdict().items() if v is not None})
        for name, regex in self._defs:
            m = regex.search(text)
            if m and m.group(1) is not None:
                found[name] = m.group(1)
        if not found:
            return []
        if "total" in found and "loss" not in found and segment.rstrip().endswith(_NESTED_BAR_END):
            return []  # a nested bar's N/M (an evaluation's batches), whatever its total
        step = self._step_of(found)
        values = {}
        for key, value in found.items():
            if key in ("step", "total", "epoch", "step_ms"):
                continue
            num = _number(value)
            if num is not None:
                values[_FIELDS.get(key, key)] = num
        if "step_ms" in found and _number(found["step_ms"]) is not None:
            values["step_s"] = _number(found["step_ms"]) / 1000.0  # type: ignore[operator]
        out: list[dict[str, Any]] = []
        if step is None:
            if not values:
                return []
            if self.preset == byo.PRESET_HF_TRAINER:
                # HF prints its logs dict with tqdm.write, which redraws the bar right after: that
                # redraw shows the dict's step (the bar's own last draw may lag behind, rate-limited).
                if self._pending is not None and self._step is not None:
                    out.append(self._record(now, self._step, self._pending))
                self._pending = values
                return out
            if self._step is None:
                return []
            return [self._record(now, self._step, values)]  # a metrics-only line: the last step's
        if self._step is not None and step < self._step and not values:
            return []  # a bar redrawn behind the training bar (eval): not a step back
        if self._pending is not None and not values:
            values, self._pending = self._pending, None
        self._step = step
        out.append(self._record(now, step, values))
        # The run's last step (a bar's or Megatron's "N/ M" total reached): what follows is the
        # wind-down (a final save, the teardown), judged by its own limit (agent/sections.py).
        total = self._total if self._total is not None else _total_of(found)
        if total is not None and step >= total and not self._ended:
            self._ended = True
            out.append({**self._record(now, step, {}), keys.EVENT: MetricEvent.TRAIN_END.value})
        return out

    def _lightning_records(self, got: list[tuple[int, float | None, bool]], now: float) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for step, loss, end in got:
            if self._step is not None and step < self._step:
                continue  # never a step back
            self._step = step
            out.append(self._record(now, step, {} if loss is None else {"loss": loss}))
            if end and not self._ended:
                self._ended = True
                out.append({**self._record(now, step, {}), keys.EVENT: MetricEvent.TRAIN_END.value})
        return out

    def _record(self, now: float, step: int, values: dict[str, float]) -> dict[str, Any]:
        rec: dict[str, Any] = {"t": now, "rank": self.rank, "step": step, "event": None}
        rec.update(values)  # NaN/inf stay: loss.nan must see them (the JSON writer spells them NaN)
        rec[byo.SOURCE_KEY] = byo.SOURCE_LOG
        return rec

    def _step_of(self, found: dict[str, Any]) -> int | None:
        if "step" in found:
            step = int(float(str(found["step"]).replace(",", "")))
            total = int(found["total"]) if found.get("total") else None
            if "epoch" in found and total:  # Lightning's bar counts batches within an epoch
                return int(found["epoch"]) * total + step
            if total is not None and "loss" not in found:  # a bar: only the training bar's total
                if step == 0:
                    return None  # drawn before the first step (or a resume's): nothing done yet
                if self._total is None:
                    self._total = total
                elif total != self._total:
                    return None
            return step
        if not self._steps_given and "loss" in found:
            self._counted += 1  # definitions without a step: each loss line is one step
            return self._counted
        return None


def _total_of(found: dict[str, Any]) -> int | None:
    """A line's own total of training steps (Megatron's "iteration N/ M"), not a per-epoch bar's."""
    if not found.get("total") or "epoch" in found:
        return None
    return int(found["total"])


class _LightningProgress:
    """Lightning's global step from its bars. A bar counts the batches of one epoch (i of n), so the
    step is where that bar started plus i: the first bar of a run starts at 0, or, in a run resumed
    from a checkpoint, where its first frame puts the step after the restored one (the checkpoint's
    `global_step`, read from the file Lightning names); each later bar starts where the one before
    it ended. The last epoch's n (the steps left) is never used as an epoch length. A line saying
    fit stopped at max_steps gives the step exactly and ends training; a bar drawn after it (Rich's
    one frame in a pipe) only brings the loss."""

    def __init__(self) -> None:
        self.base: int | None = None  # the restored checkpoint's global_step (a resumed run)
        self.step: int | None = None  # the last step given
        self.bar: str | None = None  # the bar being drawn ("E3", "T")
        self.n = 0
        self.start: int | None = None  # the step at the bar's batch 0
        self.total: int | None = None  # the bar's n (None: "?")
        self.next_start: int | None = None  # where the next bar starts
        self.shown: float | None = None  # the loss the last frame showed
        self.step_loss: float | None = None  # the loss given for the last step
        self.ended = False
        self.rich = False  # the last segment was a Rich frame: its metrics line may follow

    def feed(self, text: str) -> list[tuple[int, float | None, bool]] | None:
        """[(step, loss, train_end)] for a Lightning line, None for a line that is not one."""
        rich, self.rich = self.rich, False
        m = _LT_RESTORE.match(text)
        if m:
            self.base = _checkpoint_step(m.group("path"))
            return []
        m = _LT_STOP.search(text)
        if m:
            step = int(m.group("step"))
            self.ended, self.step = True, step
            return [(step, None, True)]
        if _LT_STOP_ANY.search(text):
            self.ended = True  # max_epochs, a callback: the step is the bar's, training is over
            return []
        m = _LT_TQDM.match(text)
        kind = "tqdm"
        if m is None:
            m = _LT_RICH.match(text)
            kind = "rich"
        if m is None:
            if rich:
                lm = _LT_RICH_METRICS.match(text)
                if lm and self.step is not None:
                    return [(self.step, _number(lm.group("loss")), False)]
            return None
        n = int(m.group("n"))
        total = int(m.group("total")) if m.group("total") != "?" else None
        epoch = int(m.group("epoch")) if m.group("epoch") is not None else None
        key = f"E{epoch}" if epoch is not None else "T"
        loss_m = (_LT_LOSS_TQDM if kind == "tqdm" else _LT_LOSS_RICH).search(m.group("post"))
        loss = _number(loss_m.group("loss")) if loss_m else None
        self.rich = kind == "rich"
        if self.ended:  # a frame drawn at the end (Rich in a pipe): the last step's loss
            return [(self.step, loss, False)] if self.step is not None and loss is not None else []
        advanced = True
        if key != self.bar or n < self.n:  # a new bar (an epoch), or tqdm's reset at an epoch's end
            if self.start is not None and self.total is not None and key != self.bar:
                # the epoch before ran to its end (its last frame may not have been drawn: Rich
                # redraws at most so often): this one starts after all of its batches
                self.next_start = self.start + self.total
            elif self.step is not None:
                self.next_start = self.step
            self.bar, self.start = key, None
        elif n == self.n:
            advanced = False
        self.n, self.total = n, total
        if n == 0:
            return []
        if self.start is None:
            self.start = self._start(epoch, n, total)
        step = self.start + n
        if self.step is not None and step < self.step:
            return []
        if step != self.step:
            self.step, self.step_loss = step, None
        shown, self.shown = self.shown, loss
        if loss is not None:
            if advanced and loss == shown:
                # Lightning draws the new count with the previous step's metrics, then the same
                # count with the new ones (tqdm: two draws; Rich: a redraw between the two updates)
                loss = None
            elif self.step_loss is not None and loss != self.step_loss:
                loss = None  # Rich: a later step's metrics on a count not redrawn yet
            else:
                self.step_loss = loss
        return [(step, loss, False)]

    def _start(self, epoch: int | None, n: int, total: int | None) -> int:
        """The step at batch 0 of a bar whose first drawn frame is batch n."""
        if self.next_start is not None:
            return self.next_start  # where the bar before ended
        if self.base is not None:
            # a resumed run's first bar: it started at or before the restored step, and its first
            # drawn batch comes after it (the next step, where each batch is drawn, as tqdm does)
            low, high = self.base + 1 - n, self.base
            if epoch is not None and total is not None and low <= epoch * total <= high:
                return epoch * total  # Rich counts the resumed epoch from its start: i of the epoch's n
            return low
        if epoch is None or epoch == 0:
            return 0
        return epoch * (total or n)  # a later epoch and nothing before it: epochs as long as this one


def _checkpoint_step(path: str) -> int | None:
    """The global_step of the checkpoint Lightning restores from: read from the file (torch-free),
    else the "step=S" of its name."""
    from agent.byo_checkpoints import lightning_step

    try:
        step = lightning_step(Path(path))
    except Exception:
        step = None
    if step is None:
        m = _LT_NAMED_STEP.search(Path(path).stem)
        step = int(m.group(1)) if m else None
    return step


class SegmentSplitter:
    """Cuts a byte stream into segments at '\\n' and '\\r' (a redrawn bar is a segment each time)."""

    def __init__(self) -> None:
        self._buf = b""

    def push(self, data: bytes) -> list[str]:
        data = self._buf + data
        parts = re.split(rb"[\r\n]", data)
        self._buf = parts.pop()
        if len(self._buf) > 1 << 20:  # a megabyte without a line end: parse what there is
            parts.append(self._buf)
            self._buf = b""
        return [p.decode("utf-8", "replace") for p in parts if p.strip()]
