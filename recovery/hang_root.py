"""The rank a hung attempt waits for, from its ranks' stacks and collective counters at stop time.

In a hang every rank stops making progress, but only one (or a few) is the cause: the others wait
for it inside a collective. Before an agent stops a hung attempt it asks each of its ranks for
its Python stacks (the in-process probe's `faulthandler` signal, `aerie_contracts.probe`) and
reads each rank's collective counter (the probe's state file, which a stopped rank cannot update
but which stays readable); the agent puts both in its verdict's evidence (`ranks`, agent/diagnose.py).
This module reads those views from every node and names the root cause, as MegaScale and ByteRobust
do from stack traces at stop time:

- a rank that did not answer (SIGSTOPped, a zombie, gone) while others did;
- else a rank that is not waiting (its main thread outside any collective and outside the autograd
  engine, where DDP's reducer waits) while others wait: it is stuck in its own code (a data
  loader, a Python loop, a deadlock of its own);
- else, every rank waiting, the ranks whose collective count is behind the others' (they wait in
  an earlier collective than their peers: a mismatched call).

A rule that picks every rank picks none: a hung collective that every rank waits in (the network,
the collective library) is no rank's fault. Standard library only: it runs with chain_restart.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from aerie_contracts.states import STOPPED_PROCESS_STATES

# Frames of a rank that waits for its peers: torch.distributed's collectives (c10d, and the
# frameworks' wrappers end there), the autograd engine (DDP's gradient all-reduce is C++, inside
# backward()), and DDP's own module.
_WAITING_PATHS = ("torch/distributed/", "torch/autograd/", "torch/nn/parallel/distributed.py")
# The probe's own wrappers sit between a collective and its caller: not the rank's code.
_PROBE_PATHS = ("agent/inproc/",)
_LIBRARY_PATHS = ("site-packages/", "dist-packages/", "/lib/python3")
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')
WAITING_DEPTH = 4  # innermost frames of the main thread that may show a wait (a wrapper or two above it)


@dataclass(frozen=True)
class RankView:
    """One rank at stop time, as its node's agent saw it."""

    host: str
    rank: str
    answered: bool  # it wrote its stacks when asked, and was not stopped
    stopped: bool  # SIGSTOPped, a zombie or gone (its stacks, if any, were taken by resuming it)
    waiting: bool  # inside a collective or the autograd engine
    collectives: int | None  # Python-visible collectives entered so far
    in_collective: str | None
    frame: str | None  # where its main thread is: "file.py:88 func()", the rank's own code first
    # It answered with no Python frame at all ("Garbage-collecting", "<no Python frame>"): the
    # interpreter was exiting (a peer node had already stopped its ranks and the collective broke)
    # or in a C call with no Python above it. Says nothing of where it was stuck: left out.
    frameless: bool = False


@dataclass(frozen=True)
class RootCause:
    culprits: tuple[RankView, ...]
    message: str

    @property
    def hosts(self) -> list[str]:
        return sorted({r.host for r in self.culprits})


def main_thread_frames(stacks: str) -> list[tuple[str, int, str]]:
    """(file, line, function) of the main thread, innermost first, from a `faulthandler` dump; the
    last dump in the text when it holds several (the signal was sent more than once)."""
    dumps = stacks.split("Current thread ")
    if len(dumps) < 2:
        return []
    frames: list[tuple[str, int, str]] = []
    for line in dumps[-1].splitlines()[1:]:
        m = _FRAME.match(line)
        if m is None:
            if frames and not line.strip():
                break  # the end of the main thread's block
            continue
        frames.append((m["file"], int(m["line"]), m["func"]))
    return frames


def rank_view(host: str, rank: str, seen: dict[str, Any]) -> RankView:
    """A rank's view from its node's evidence (`agent/diagnose.py`: process state, state file, stacks)."""
    stopped = seen.get("process_state") in STOPPED_PROCESS_STATES
    frames = [f for f in main_thread_frames(str(seen.get("stack") or "")) if not _under(f[0], _PROBE_PATHS)]
    in_collective = seen.get("in_collective") if isinstance(seen.get("in_collective"), str) else None
    waiting = in_collective is not None or any(_under(f[0], _WAITING_PATHS) for f in frames[:WAITING_DEPTH])
    count = seen.get("collectives")
    return RankView(
        host=host,
        rank=str(rank),
        answered=bool(seen.get("answered")) and bool(frames) and not stopped,
        stopped=stopped,
        waiting=waiting,
        collectives=int(count) if isinstance(count, int) and not isinstance(count, bool) else None,
        in_collective=in_collective,
        frame=_describe(frames),
        frameless=bool(seen.get("answered")) and not frames and not stopped and bool(seen.get("stack")),
    )


def views_from_verdicts(verdicts: list[dict[str, Any]]) -> list[RankView]:
    """Every rank's view in the verdicts' evidence (`evidence.ranks`), one per (host, rank): the
    earliest verdict's, taken before any node was stopped."""
    seen: dict[tuple[str, str], RankView] = {}
    for v in sorted(verdicts, key=lambda v: v.get("t") or 0.0):
        ranks = (v.get("evidence") or {}).get("ranks")
        if not isinstance(ranks, dict) or not v.get("host"):
            continue
        for rank, view in ranks.items():
            if isinstance(view, dict) and (v["host"], str(rank)) not in seen:
                seen[(v["host"], str(rank))] = rank_view(v["host"], str(rank), view)
    return list(seen.values())


def find_root_cause(views: list[RankView]) -> RootCause | None:
    """The rank(s) the others wait for, or None when the views single out none (module docstring)."""
    views = [r for r in views if not r.frameless]
    if len(views) < 2:
        return None
    silent = [r for r in views if not r.answered]
    if silent and len(silent) < len(views):
        how = "stopped or gone" if all(r.stopped for r in silent) else "did not answer"
        return _cause(silent, views, how)
    answered = [r for r in views if r.answered]
    stuck = [r for r in answered if not r.waiting]
    if stuck and len(stuck) < len(answered):
        return _cause(stuck, views, "is not in a collective")
    counted = [r for r in answered if r.collectives is not None]
    if len(counted) == len(answered) and counted:
        low = min(r.collectives for r in counted if r.collectives is not None)
        behind = [r for r in counted if r.collectives == low]
        if len(behind) < len(counted):
            return _cause(behind, views, f"is behind at collective #{low}")
    return None


def _cause(culprits: list[RankView], views: list[RankView], how: str) -> RootCause:
    waiting = [r for r in views if r not in culprits and r.waiting]
    names = ", ".join(f"rank {r.rank} on {r.host}" + (f" in {r.frame}" if r.frame else "") for r in culprits)
    message = f"root cause: {names} ({how})"
    if waiting:
        counts = [r.collectives for r in waiting if r.collectives is not None]
        where = next((r.in_collective for r in waiting if r.in_collective), None) or "a collective"
        message += f"; {len(waiting)} rank(s) wait in {where}" + (f" #{max(counts)}" if counts else "")
    return RootCause(tuple(culprits), message)


def _describe(frames: list[tuple[str, int, str]]) -> str | None:
    """The rank's own code first (its innermost frame outside libraries), else the innermost frame."""
    if not frames:
        return None
    own = next((f for f in frames if not _under(f[0], _LIBRARY_PATHS)), frames[0])
    return f"{_short(own[0])}:{own[1]} {own[2]}()"


def _short(path: str) -> str:
    parts = path.replace("\\", "/").split("/")
    return "/".join(parts[-2:])


def _under(path: str, prefixes: tuple[str, ...]) -> bool:
    path = path.replace("\\", "/")
    return any(p in path for p in prefixes)
