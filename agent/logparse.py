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
from typing import Any

from aerie_contracts import byo
from aerie_contracts import metrics as keys
from aerie_contracts.metrics import MetricEvent

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")  # torchtitan colours its metrics line
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
    byo.PRESET_LIGHTNING: [
        rf"^\s*Epoch (?P<epoch>\d+):\s+\d+%\|[^|]*\|\s*(?P<step>\d+)/(?P<total>\d+) \["
        rf"(?:[^\]]*?\b(?:train_)?loss(?:_step)?=(?P<loss>{_NUM}))?",
    ],
}
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
        self._steps_given = any(name == "step" for name, _ in self._defs) or bool(self._rules)

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
