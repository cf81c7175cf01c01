"""The goodput ledger: every second of a job's timeline assigned to one category (a pure function).

The timeline runs from submission to the job's end (or now) and is cut into contiguous segments;
each node is paid for all of it, so category totals are segment lengths × nodes and their sum is
wall time × nodes exactly. Per attempt:

- before it was created: the restart gap after the previous attempt (its first: launch);
- created → started: launch (scheduling, provisioning, the backend's start);
- started → its first step began (its first step point minus a step time per step from its resume
  point to that point): start-up, of which the
  restore is what the nodes measured (each agent reports its ranks' slowest restore, the
  trainer's `restored` event, in its heartbeats); without that measurement (another trainer),
  the part beyond the first fresh attempt's start-up;
- restarted in place (the same agents, a new worker group: nothing scheduled or booted): created →
  first step began is all restart, less the measured restore;
- between step points: step work (redone when an earlier attempt already trained those steps,
  else productive); a gap's excess over the attempt's median step time is checkpoint stall after
  a checkpointed step, up to what the saves explain (an S3 save's recorded duration, a memory
  snapshot's measured stall), an eval pause after an eval step, idle when it exceeds a step's
  worth with no such reason (step-time noise stays productive);
- after its last step: failed → detection (last step → first verdict, or → its end when no detector
  fired, e.g. a crash) then restart (teardown); completed → the final save's stall then teardown;
  running → the step in flight (productive up to `IN_FLIGHT_STEPS` step times plus the agent's
  batching delay), idle beyond. A failed attempt's fault is at its last step before the verdict:
  steps its ranks finished while being stopped are teardown (restart), and steps trained on from
  a bad loss (`loss.nan`, `loss.spike`: the fault is that step) are detection delay.

A fault's redone steps are counted from the step the next attempt's ranks really resumed at (the
`restored` step its agents report, no later than the step before its first point): a memory
resume point that fell back to S3 redoes more.
"""

from __future__ import annotations

import itertools
import statistics
from dataclasses import dataclass, field
from typing import Any

from aerie_contracts.checkpoints import CheckpointTier
from aerie_contracts.goodput import Category
from aerie_contracts.restarts import RestartMode
from aerie_contracts.states import AttemptState, JobState
from orchestrator.goodput.trace import AttemptTrace, CheckpointTrace, JobTrace

IN_FLIGHT_STEPS = 2
METRICS_DELAY_S = 5.0  # agents forward step points every 2 s; heartbeats every 5 s


@dataclass
class Segment:
    start: float
    end: float
    category: str
    attempt: int | None

    def as_dict(self) -> dict[str, Any]:
        return {"start": self.start, "end": self.end, "category": self.category, "attempt": self.attempt}


@dataclass
class _Cursor:
    t: float
    segments: list[Segment] = field(default_factory=list)

    def to(self, end: float, category: str, attempt: int | None) -> None:
        """Extend the timeline to `end` with `category`; time already covered is never counted twice."""
        if end <= self.t:
            return
        last = self.segments[-1] if self.segments else None
        if last and last.category == category and last.attempt == attempt and last.end == self.t:
            last.end = end
        else:
            self.segments.append(Segment(self.t, end, category, attempt))
        self.t = end


def step_time(points: list[tuple[int, float]]) -> float | None:
    """Median seconds per step between consecutive points of one attempt."""
    rates = [(t1 - t0) / (s1 - s0) for (s0, t0), (s1, t1) in itertools.pairwise(points) if s1 > s0 and t1 >= t0]
    return statistics.median(rates) if rates else None


def resumed_at(a: AttemptTrace) -> int:
    """The step the attempt's ranks resumed at (0: from scratch): what they report restoring, else
    what its `resume_from` names, and never later than the step before its first point."""
    resumed = a.resumed_step or 0
    return max(0, min(resumed, a.points[0][0] - 1)) if a.points else resumed


def _first_began(a: AttemptTrace, d: float) -> float:
    """When its first step began: the steps from its resume point to its first point (more than one
    with `log_every` > 1, or when that point's line was lost) took a step time each."""
    first_step, first_t = a.points[0]
    return first_t - d * max(1, first_step - resumed_at(a))


def _startup(a: AttemptTrace, d: float) -> float | None:
    if not a.points or a.started_at is None:
        return None
    return max(0.0, _first_began(a, d) - a.started_at)


def _verdict_cut(a: AttemptTrace, d: float) -> tuple[float, str] | None:
    """The fault's detection: the attempt's first verdict once it trained (before its first step
    began, a verdict is about its start-up), or None when no detector fired (a crash)."""
    began = _first_began(a, d) if a.points else float("-inf")
    return next(((t, k) for t, k in a.verdicts if t >= began), None)


def _save_caps(checkpoints: list[CheckpointTrace]) -> dict[int, float]:
    """Per S3 save (by id), how long the step loop can have waited on account of it: its recorded
    duration (stall + upload, an upper bound of its stall) plus the save before it (a save first
    waits for the upload in flight); unknown durations bound nothing."""
    caps: dict[int, float] = {}
    previous = 0.0
    for c in sorted((c for c in checkpoints if c.tier != CheckpointTier.MEMORY), key=lambda c: c.created_at):
        caps[id(c)] = float("inf") if c.save_s is None else c.save_s + previous
        previous = c.save_s if c.save_s is not None else float("inf")
    return caps


def _stall_cap(ckpts: list[CheckpointTrace], a: AttemptTrace, caps: dict[int, float]) -> float:
    """How much of a gap after checkpointed steps the saves explain: an S3 save what `_save_caps`
    allows, a memory snapshot its measured stall (none unmeasured: at a snapshot every few steps,
    step-time noise would pass for stall). The rest of the gap is what it would be without them (a
    hang is not a checkpoint stall)."""
    return sum(
        (a.snapshot_s or 0.0) if c.tier == CheckpointTier.MEMORY else caps.get(id(c), float("inf")) for c in ckpts
    )


def compute(trace: JobTrace, advice: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The ledger (the shape documented in aerie_contracts.goodput)."""
    end = trace.ended_at if trace.ended_at is not None else trace.now
    cur = _Cursor(trace.created_at)
    attempts = sorted(trace.attempts, key=lambda a: a.number)
    job_d = step_time([p for a in attempts for p in a.points]) or 0.0
    by_step: dict[int, list[CheckpointTrace]] = {}
    caps = _save_caps(trace.checkpoints)
    for c in trace.checkpoints:
        by_step.setdefault(c.step, []).append(c)
    fresh_startups = [
        x for a in attempts if not a.resumed_step for x in [_startup(a, step_time(a.points) or job_d)] if x is not None
    ]
    base_startup = min(fresh_startups) if fresh_startups else None
    done = 0  # the highest step any earlier attempt trained
    faults: list[dict[str, Any]] = []
    trained: dict[int, int] = {}  # attempt → the last step it trained validly (what its successor may redo)

    for a in attempts:
        n = a.number
        d = step_time(a.points) or job_d
        in_place = a.mode == RestartMode.IN_PLACE and n > 1
        # In place, nothing is scheduled or booted: the new worker group's start is the restart.
        launch, startup = (Category.RESTART, Category.RESTART) if in_place else (Category.LAUNCH, Category.STARTUP)
        a_end = min(a.ended_at if a.ended_at is not None else end, end)
        cur.to(min(a.created_at, end), Category.RESTART if n > 1 else Category.LAUNCH, n)
        if a.started_at is not None:
            cur.to(min(a.started_at, a_end), launch, n)
        if not a.points:
            # Never reached a step: it all went to starting (a failure here is a start-up failure),
            # the nodes' pre-flight checks first.
            first_verdict = next((t for t, _ in a.verdicts if t >= cur.t), None)
            if a.preflight_s:
                cur.to(min(cur.t + a.preflight_s, first_verdict or a_end, a_end), Category.PREFLIGHT, n)
            if first_verdict is not None:
                cur.to(min(first_verdict, a_end), startup, n)
                cur.to(a_end, Category.RESTART, n)
            cur.to(a_end, startup, n)
            continue
        failed = a.state == AttemptState.FAILED or (a.state == AttemptState.STOPPED and bool(a.reason_kind))
        verdict = _verdict_cut(a, d) if failed else None
        # A verdict before the last point: steps finished while the ranks were being stopped.
        cut = verdict[0] if verdict and verdict[0] < a.points[-1][1] else None
        fault_step = a.loss_fault_step if failed else None
        first_step, first_t = a.points[0]
        began = min(_first_began(a, d), a_end)
        starting = max(0.0, began - cur.t)
        restore = 0.0
        if a.restore_s is not None:
            restore = min(starting, a.restore_s)
        elif a.resumed_step and base_startup is not None and not in_place:
            restore = min(starting, max(0.0, starting - base_startup))
        if a.preflight_s:  # the agents check their nodes before anything else starts
            cur.to(cur.t + min(max(0.0, starting - restore), a.preflight_s), Category.PREFLIGHT, n)
        cur.to(began - restore, startup, n)
        cur.to(began, Category.RESTORE, n)
        # The steps up to the first point: redone as far as an earlier attempt had trained them.
        resumed = resumed_at(a)
        span = max(1, first_step - resumed)
        redone_first = min(span, max(0, done - resumed)) / span
        cur.to(cur.t + (min(first_t, a_end) - cur.t) * redone_first, Category.REDONE, n)
        cur.to(min(first_t, a_end), Category.PRODUCTIVE, n)
        for (s0, t0), (s1, t1) in zip(a.points, a.points[1:]):
            t1 = min(t1, a_end)
            if cut is not None and t1 > cut:
                cur.to(cut, Category.DETECTION, n)  # the hang (or whatever the verdict saw), up to the verdict
                cur.to(t1, Category.RESTART, n)  # a step finished while its ranks were stopped
                continue
            if fault_step is not None and s0 >= fault_step:
                cur.to(t1, Category.DETECTION, n)  # trained on from a bad loss until the verdict stopped it
                continue
            steps = max(1, s1 - s0)
            gap = max(0.0, t1 - max(t0, cur.t))
            work = min(gap, steps * d)
            excess = gap - work
            ckpts = [c for s in range(s0, s1) for c in by_step.get(s, []) if c.attempt in (n, None)]
            if ckpts:
                stall = min(excess, _stall_cap(ckpts, a, caps))
                cur.to(cur.t + stall, Category.CHECKPOINT_STALL, n)
                excess -= stall
            if excess > 0 and trace.eval_every and any(s > 0 and s % trace.eval_every == 0 for s in range(s0, s1)):
                cur.to(cur.t + excess, Category.EVAL, n)
            elif excess > steps * d:
                cur.to(cur.t + excess, Category.IDLE, n)
            redone = min(steps, max(0, done - s0)) / steps
            cur.to(cur.t + (t1 - cur.t) * redone, Category.REDONE, n)
            cur.to(t1, Category.PRODUCTIVE, n)
        last_step, last_t = a.points[-1]
        trained[n] = last_step
        if a.state == AttemptState.COMPLETED:
            final = [c for c in by_step.get(last_step, []) if c.attempt == n and c.tier == CheckpointTier.S3]
            if final and final[0].save_s:
                cur.to(min(cur.t + final[0].save_s, a_end), Category.CHECKPOINT_STALL, n)
            cur.to(a_end, Category.RESTART, n)
        elif failed:
            if fault_step is not None:  # the fault is the first bad step, not the last step run
                last_step, last_t = next(((p, t) for p, t in a.points if p >= fault_step), (last_step, last_t))
                trained[n] = last_step
            elif cut is not None:  # the last step before the verdict
                last_step, last_t = next((p, t) for p, t in reversed(a.points) if t <= cut or p == first_step)
            detected = min(verdict[0], a_end) if verdict else a_end
            cur.to(detected, Category.DETECTION, n)
            cur.to(a_end, Category.RESTART, n)
            faults.append(
                {
                    "attempt": n,
                    "kind": a.reason_kind or (verdict[1] if verdict else None),
                    "last_step": last_step,
                    "last_step_t": last_t,
                    "verdict_t": verdict[0] if verdict else None,
                    "detection_s": max(0.0, detected - last_t),
                    "detected_t": detected,
                    # Filled from the attempt after: how it started, and the seconds from detection
                    # (the verdict, or the attempt's end without one) to its first step.
                    "restart_mode": None,
                    "recovery_s": None,
                    "resumed_step": None,
                    "redone_steps": 0,
                    "redone_s": 0.0,
                }
            )
        elif a.ended_at is not None:  # stopped by a person: teardown
            cur.to(a_end, Category.RESTART, n)
        else:  # running: the step in flight, then idle if nothing arrives
            cur.to(min(a_end, last_t + IN_FLIGHT_STEPS * d + METRICS_DELAY_S), Category.PRODUCTIVE, n)
            cur.to(a_end, Category.IDLE, n)
        done = max(done, trained[n])

    # What each failure cost the attempt after it: steps trained again past its resume point (the
    # step its ranks really resumed at: no later than the step before its first point).
    by_number = {a.number: a for a in attempts}
    for f in faults:
        nxt = by_number.get(f["attempt"] + 1)
        if nxt is None:
            continue
        resumed = resumed_at(nxt)
        f["restart_mode"] = nxt.mode
        f["recovery_s"] = max(0.0, nxt.points[0][1] - f["detected_t"]) if nxt.points else None
        f["resumed_step"] = resumed
        f["redone_steps"] = max(0, min(trained[f["attempt"]], nxt.points[-1][0] if nxt.points else resumed) - resumed)
        f["redone_s"] = sum(
            (s.end - s.start) * trace.nodes
            for s in cur.segments
            if s.attempt == nxt.number and s.category == Category.REDONE
        )
    if trace.state in (JobState.COMPLETED, JobState.FAILED, JobState.STOPPED) or not attempts:
        cur.to(end, Category.RESTART if attempts else Category.LAUNCH, None)
    elif attempts[-1].ended_at is not None:
        cur.to(end, Category.RESTART, None)  # waiting for the chain's next attempt
    else:
        cur.to(end, Category.IDLE, None)
    return _summarise(trace, end, cur.segments, faults, advice)


def _summarise(
    trace: JobTrace,
    end: float,
    segments: list[Segment],
    faults: list[dict[str, Any]],
    advice: list[dict[str, Any]] | None,
) -> dict[str, Any]:
    totals = {c.value: 0.0 for c in Category}
    for s in segments:
        totals[s.category] += (s.end - s.start) * trace.nodes
    wall = max(0.0, end - trace.created_at)
    node_seconds = wall * trace.nodes
    return {
        "job_id": trace.job_id,
        "name": trace.name,
        "state": trace.state,
        "nodes": trace.nodes,
        "start": trace.created_at,
        "end": end,
        "wall_s": wall,
        "node_seconds": node_seconds,
        "goodput": totals[Category.PRODUCTIVE] / node_seconds if node_seconds > 0 else 0.0,
        "categories": totals,
        "segments": [s.as_dict() for s in segments],
        "faults": faults,
        "advice": advice or [],
    }
