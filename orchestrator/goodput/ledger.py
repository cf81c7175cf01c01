"""The goodput ledger: every second of a job's timeline assigned to one category (a pure function).

The timeline runs from submission to the job's end (or now) and is cut into contiguous segments;
each node is paid for all of it, so category totals are segment lengths × nodes and their sum is
wall time × nodes exactly. Per attempt:

- before it was created: the restart gap after the previous attempt (its first: launch);
- created → started: launch (scheduling, provisioning, the backend's start);
- started → its first step began (first step point minus one step time): start-up, of which the
  restore is what the nodes measured (each agent reports its ranks' slowest restore, the
  trainer's `restored` event, in its heartbeats); without that measurement (another trainer),
  the part beyond the first fresh attempt's start-up;
- between step points: step work (redone when an earlier attempt already trained those steps,
  else productive); a gap's excess over the attempt's median step time is checkpoint stall after
  a checkpointed step, an eval pause after an eval step, idle when it exceeds a step's worth
  with no such reason (step-time noise stays productive);
- after its last step: failed → detection (last step → first verdict, or → its end when no detector
  fired, e.g. a crash) then restart (teardown); completed → the final save's stall then teardown;
  running → the step in flight (productive up to `IN_FLIGHT_STEPS` step times plus the agent's
  batching delay), idle beyond.
"""

from __future__ import annotations

import itertools
import statistics
from dataclasses import dataclass, field
from typing import Any

from aerie_contracts.goodput import Category
from aerie_contracts.states import AttemptState, JobState
from orchestrator.goodput.trace import AttemptTrace, JobTrace

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


def _startup(a: AttemptTrace, d: float) -> float | None:
    if not a.points or a.started_at is None:
        return None
    return max(0.0, a.points[0][1] - d - a.started_at)


def compute(trace: JobTrace, advice: dict[str, Any] | None = None) -> dict[str, Any]:
    """The ledger (the shape documented in aerie_contracts.goodput)."""
    end = trace.ended_at if trace.ended_at is not None else trace.now
    cur = _Cursor(trace.created_at)
    attempts = sorted(trace.attempts, key=lambda a: a.number)
    job_d = step_time([p for a in attempts for p in a.points]) or 0.0
    saves = {(c.attempt, c.step): c for c in trace.checkpoints}
    saved_steps = {c.step for c in trace.checkpoints}
    fresh_startups = [
        x for a in attempts if not a.resumed_step for x in [_startup(a, step_time(a.points) or job_d)] if x is not None
    ]
    base_startup = min(fresh_startups) if fresh_startups else None
    done = 0  # the highest step any earlier attempt trained
    faults: list[dict[str, Any]] = []

    for a in attempts:
        n = a.number
        d = step_time(a.points) or job_d
        a_end = min(a.ended_at if a.ended_at is not None else end, end)
        cur.to(min(a.created_at, end), Category.RESTART if n > 1 else Category.LAUNCH, n)
        if a.started_at is not None:
            cur.to(min(a.started_at, a_end), Category.LAUNCH, n)
        if not a.points:
            # Never reached a step: it all went to starting (a failure here is a start-up failure),
            # the nodes' pre-flight checks first.
            first_verdict = next((t for t, _ in a.verdicts if t >= cur.t), None)
            if a.preflight_s:
                cur.to(min(cur.t + a.preflight_s, first_verdict or a_end, a_end), Category.PREFLIGHT, n)
            if first_verdict is not None:
                cur.to(min(first_verdict, a_end), Category.STARTUP, n)
                cur.to(a_end, Category.RESTART, n)
            cur.to(a_end, Category.STARTUP, n)
            continue
        first_step, first_t = a.points[0]
        began = min(first_t - d, a_end)
        startup = max(0.0, began - cur.t)
        restore = 0.0
        if a.restore_s is not None:
            restore = min(startup, a.restore_s)
        elif a.resumed_step and base_startup is not None:
            restore = min(startup, max(0.0, startup - base_startup))
        if a.preflight_s:  # the agents check their nodes before anything else starts
            cur.to(cur.t + min(max(0.0, startup - restore), a.preflight_s), Category.PREFLIGHT, n)
        cur.to(began - restore, Category.STARTUP, n)
        cur.to(began, Category.RESTORE, n)
        cur.to(min(first_t, a_end), Category.REDONE if first_step <= done else Category.PRODUCTIVE, n)
        for (s0, t0), (s1, t1) in zip(a.points, a.points[1:]):
            t1 = min(t1, a_end)
            steps = max(1, s1 - s0)
            gap = max(0.0, t1 - max(t0, cur.t))
            work = min(gap, steps * d)
            excess = gap - work
            if any((n, s) in saves or s in saved_steps for s in range(s0, s1)):
                cur.to(cur.t + excess, Category.CHECKPOINT_STALL, n)
            elif trace.eval_every and any(s > 0 and s % trace.eval_every == 0 for s in range(s0, s1)):
                cur.to(cur.t + excess, Category.EVAL, n)
            elif excess > steps * d:
                cur.to(cur.t + excess, Category.IDLE, n)
            redone = min(steps, max(0, done - s0)) / steps
            cur.to(cur.t + (t1 - cur.t) * redone, Category.REDONE, n)
            cur.to(t1, Category.PRODUCTIVE, n)
        last_step, last_t = a.points[-1]
        if a.state == AttemptState.COMPLETED:
            final = saves.get((n, last_step))
            if final and final.save_s:
                cur.to(min(cur.t + final.save_s, a_end), Category.CHECKPOINT_STALL, n)
            cur.to(a_end, Category.RESTART, n)
        elif a.state in (AttemptState.FAILED,) or (a.state == AttemptState.STOPPED and a.reason_kind):
            verdict = next(((t, k) for t, k in a.verdicts if t >= last_t), None)
            if a.loss_fault_step is not None:  # the fault is the first bad step, not the last step run
                last_step, last_t = next(((p, t) for p, t in a.points if p >= a.loss_fault_step), (last_step, last_t))
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
        done = max(done, last_step)

    # What each failure cost the attempt after it: steps trained again past its resume point.
    by_number = {a.number: a for a in attempts}
    for f in faults:
        nxt = by_number.get(f["attempt"] + 1)
        if nxt is None:
            continue
        resumed = nxt.resumed_step or 0
        f["resumed_step"] = resumed
        f["redone_steps"] = max(0, min(f["last_step"], nxt.points[-1][0] if nxt.points else resumed) - resumed)
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
    trace: JobTrace, end: float, segments: list[Segment], faults: list[dict[str, Any]], advice: dict[str, Any] | None
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
        "advice": advice,
    }
