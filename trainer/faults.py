"""Deliberate faults, for chaos tests and for users who want to rehearse a bad night.

A job asks for faults through `AERIE_FAULTS` (JSON list; `aerie submit --fault` writes it), e.g.
`[{"kind": "busy_hang", "step": 30, "rank": 1}]`. Each fault fires once, in the attempt it names
(default 1), so the restarted attempt runs clean and a chaos run can finish. Kinds:

- `nan`        the loss of `rank` turns NaN from `step` on (loss.nan)
- `busy_hang`  `rank` spins at full CPU and never finishes the step: "100 % busy, nothing moves"
- `sigstop`    `rank` stops itself (SIGSTOP): its peers block in the next collective (silent.hang)
- `sigkill`    `rank` dies with SIGKILL (exit.nonzero with the signal)
- `exit`       `rank` exits with `code` (default 1)
- `slow`       `rank` sleeps `seconds` per step from `step` on (a straggler)
- `spike`      the loss `rank` reports is `factor` (default 10) times larger from `step` on
               (loss.spike; the gradients are untouched)
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import time
from dataclasses import dataclass

from aerie_contracts import env as aerie_env

KINDS = ("nan", "busy_hang", "sigstop", "sigkill", "exit", "slow", "spike")


@dataclass(frozen=True)
class Fault:
    kind: str
    step: int
    rank: int | None = None  # None: every rank
    attempt: int = 1
    code: int = 1
    seconds: float = 1.0
    factor: float = 10.0

    def applies(self, step: int, rank: int, attempt: int) -> bool:
        return attempt == self.attempt and (self.rank is None or self.rank == rank) and step >= self.step


def parse(text: str | None) -> list[Fault]:
    """The faults of `AERIE_FAULTS`; a bad one is a ValueError that names it (a typo must not
    quietly make a chaos run fault-free, nor fire in every attempt)."""
    if not text:
        return []
    items = json.loads(text)
    if not isinstance(items, list):
        raise ValueError(f"{aerie_env.FAULTS} must be a JSON list of faults, got {type(items).__name__}")
    return [_fault(item) for item in items]


_FIELDS = {f.name for f in dataclasses.fields(Fault)}


def _fault(item: object) -> Fault:
    if not isinstance(item, dict):
        raise ValueError(f"a fault is a JSON object, got {item!r}")
    if item.get("kind") not in KINDS:
        raise ValueError(f"unknown fault kind {item.get('kind')!r}; known: {', '.join(KINDS)}")
    unknown = sorted(set(item) - _FIELDS)
    if unknown:
        raise ValueError(f"unknown fault option(s) {unknown} in {item}; known: {', '.join(sorted(_FIELDS))}")

    def whole(key: str, least: int) -> None:
        value = item.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < least):
            raise ValueError(f"fault {key} must be a whole number >= {least}, got {value!r} in {item}")

    whole("step", 0)
    whole("rank", 0)
    whole("attempt", 1)  # attempts are numbered from 1
    whole("code", 0)
    if "step" not in item:
        raise ValueError(f"a fault needs the step it fires at: {item}")
    for key in ("seconds", "factor"):
        value = item.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0):
            raise ValueError(f"fault {key} must be a number >= 0, got {value!r} in {item}")
    return Fault(**item)


def parse_cli(spec: str) -> dict:
    """`KIND@STEP[:rank=R][:attempt=N][:code=C][:seconds=S][:factor=F]` -> a fault dict (for `aerie submit --fault`)."""
    head, *opts = spec.split(":")
    kind, _, step = head.partition("@")
    if kind not in KINDS or not step.isdigit():
        raise ValueError(f"bad fault {spec!r}: expected KIND@STEP[:rank=R][:attempt=N], KIND in {', '.join(KINDS)}")
    fault: dict = {"kind": kind, "step": int(step)}
    for opt in opts:
        key, _, value = opt.partition("=")
        if key not in ("rank", "attempt", "code", "seconds", "factor") or not value:
            raise ValueError(f"bad fault option {opt!r} in {spec!r}")
        fault[key] = float(value) if key in ("seconds", "factor") else int(value)
    return fault


class FaultInjector:
    """Called by the train loop once per step; does nothing unless the environment asks."""

    def __init__(self, rank: int, env: dict[str, str] | None = None):
        env = dict(os.environ if env is None else env)
        self.rank = rank
        self.attempt = int(env.get(aerie_env.ATTEMPT_NUMBER, "1"))
        self.faults = [f for f in parse(env.get(aerie_env.FAULTS)) if self.rank == f.rank or f.rank is None]

    def __bool__(self) -> bool:
        return bool(self.faults)

    def loss_is_nan(self, step: int) -> bool:
        return any(f.kind == "nan" and f.applies(step, self.rank, self.attempt) for f in self.faults)

    def loss_scale(self, step: int) -> float:
        """The factor a `spike` fault multiplies this rank's loss by at `step` (1.0: none)."""
        scale = 1.0
        for f in self.faults:
            if f.kind == "spike" and f.applies(step, self.rank, self.attempt):
                scale *= f.factor
        return scale

    def before_step(self, step: int) -> None:
        for f in self.faults:
            if not f.applies(step, self.rank, self.attempt):
                continue
            if f.kind == "busy_hang" and step == f.step:
                _spin_forever()
            elif f.kind == "sigstop" and step == f.step:
                os.kill(os.getpid(), signal.SIGSTOP)
            elif f.kind == "sigkill" and step == f.step:
                os.kill(os.getpid(), signal.SIGKILL)
            elif f.kind == "exit" and step == f.step:
                os._exit(f.code)
            elif f.kind == "slow":
                time.sleep(f.seconds)


def _spin_forever() -> None:
    x = 0
    while True:  # a busy hang: full utilisation, no progress
        x = (x * 1103515245 + 12345) & 0xFFFFFFFF
