"""What a node's detectors look at: a :class:`Window` of samples, and the :class:`Verdict` they give.

Both are JSON-shaped (string keys, strict JSON evidence), so recorded traces store and replay them
byte for byte. Nothing here reads files, clocks or processes.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any


@dataclass(frozen=True)
class Verdict:
    kind: str
    message: str
    evidence: dict  # strict JSON (no NaN); always holds the "window" the verdict was taken on

    def __post_init__(self) -> None:
        object.__setattr__(self, "evidence", jsonable(self.evidence))


def jsonable(x: Any) -> Any:
    """Strict JSON: NaN/inf become strings (PostgreSQL's jsonb and ``allow_nan=False`` reject them)."""
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    return x


@dataclass
class Window:
    """What the probes saw, JSON-shaped (string keys) so traces store and replay it as is.

    ``steps`` holds training steps only, ``[t, step, loss, step_s]`` per rank; ``pauses`` the
    closed checkpoint-stall/eval intervals ``[t_begin, t_end]``; ``open`` the ones still running;
    ``uploads`` the asynchronous checkpoint uploads still running (steps go on beside them).
    ``sections`` holds this attempt's closed section durations, ``learned`` those the job's previous
    attempts reported (``AERIE_SECTIONS``); ``first_step_t`` ends the setup section.
    """

    now: float
    started_at: float
    accel: dict[str, list[list[float]]] = field(default_factory=dict)  # index -> [[t, util %]]
    nics: dict[str, list[list[float]]] = field(default_factory=dict)  # iface -> [[t, bytes/s]]
    nic_state: dict[str, str] = field(default_factory=dict)  # iface -> operstate
    retrans: list[list[float]] = field(default_factory=list)  # [[t, TCP RetransSegs total]]
    steps: dict[str, list[list]] = field(default_factory=dict)  # rank -> [[t, step, loss, step_s]]
    open: dict[str, dict[str, float]] = field(default_factory=dict)  # rank -> {"checkpoint": t0}
    pauses: list[list[float]] = field(default_factory=list)
    processes: list[dict] = field(default_factory=list)  # [{"rank", "pid", "state", "cpu"}]
    uploads: dict[str, float] = field(default_factory=dict)  # rank -> upload start
    sections: dict[str, list[float]] = field(default_factory=dict)  # section -> durations (this attempt)
    learned: dict[str, list[float]] = field(default_factory=dict)  # section -> durations (before it)
    first_step_t: float | None = None
    nan_records: dict[str, dict] = field(default_factory=dict)  # rank -> its first non-finite step line

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> Window:
        return cls(**{f.name: d[f.name] for f in fields(cls) if f.name in d})


# ----------------------------------------------------------------------------- helpers


def since(series: list, t0: float) -> list:
    return [s for s in series if s[0] >= t0]


def finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def as_loss(x: Any) -> float | None:
    """Losses arrive as numbers, ``NaN`` tokens, or strings like ``"nan"``; ``None`` = not logged."""
    if x is None or isinstance(x, bool):
        return None
    try:
        return float(x)
    except (TypeError, ValueError):
        return None


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    k = (len(s) - 1) * q / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def step_times(w: Window) -> list[float]:
    """Step durations: ``step_s`` when the trainer logs it, else gaps between consecutive steps
    that do not straddle a checkpoint/eval pause."""
    out: list[float] = []
    for series in w.steps.values():
        prev_t = None
        for t, _step, _loss, step_s in series:
            if finite(step_s) and step_s >= 0:
                out.append(float(step_s))
            elif prev_t is not None and not any(prev_t <= b and e <= t for b, e in w.pauses):
                out.append(t - prev_t)
            prev_t = t
    return out


def last_pause_end(w: Window) -> float:
    return max((e for _b, e in w.pauses), default=-math.inf)


def window_evidence(w: Window, seconds: float) -> dict:
    """The slice of the window a verdict was taken on (bounded, so evidence stays small)."""
    t0 = w.now - seconds
    return {
        "now": w.now,
        "started_at": w.started_at,
        "accel": {k: since(v, t0) for k, v in w.accel.items()},
        "nics": {k: since(v, t0) for k, v in w.nics.items()},
        "nic_state": dict(w.nic_state),
        "retrans": since(w.retrans, t0),
        "steps": {k: v[-20:] for k, v in w.steps.items()},
        "open": dict(w.open),
        "uploads": dict(w.uploads),
        "pauses": w.pauses[-5:],
        "processes": list(w.processes),
    }


def last_step_ts(w: Window) -> dict[str, float]:
    return {r: s[-1][0] for r, s in w.steps.items() if s}
