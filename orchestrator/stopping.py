"""Has a job run out of its StoppingCondition? A pure decision over the store's times.

The controller asks once per reconcile pass (`controller_limits.enforce_stopping`) and, when a limit is
out, stops the job exactly as a user's StopTrainingJob / `aerie stop` does (`stop_requested`: the
agents get SIGTERM, an in-flight checkpoint save may finish and commit, a torn one never has a
manifest) and the job ends Stopped with the limit's reason (`aerie_contracts.failures.STOP_LIMITS`:
SageMaker's `MaxRuntimeExceeded` / `MaxWaitTimeExceeded`).

What is counted, and why:

- `stopping.max_runtime_s` (MaxRuntimeInSeconds) bounds the job's *training time*: the time its
  attempts ran (each attempt from the moment its backend started it, the read model's `Training`
  transition and SageMaker's TrainingStartTime, to its end or now), summed over every attempt.
  SageMaker documents that with a RetryStrategy the limit is "the maximum time for all of the
  attempts in total, not each individual attempt"; a restart does not reset it. The gaps between
  attempts (the restart decision, a relaunch being placed) and the time before the first attempt
  starts are not training and are not counted. On Slurm an attempt runs from its `sbatch`: time
  queued in the partition counts, as the read model shows it as Training.
- `stopping.max_wait_s` (MaxWaitTimeInSeconds, managed spot) bounds the wall-clock time since the
  job was created, every wait included, as SageMaker's does ("the amount of time spent waiting for
  Spot capacity plus the amount of time the job can run"); it is never below max_runtime_s
  (the spec refuses that, as SageMaker does).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from aerie_contracts.failures import STOP_LIMITS, FailureKind, reason

Span = tuple[float | None, float | None]  # an attempt's (started_at, ended_at); None: not yet


def training_seconds(spans: Iterable[Span], now: float) -> float:
    """Seconds covered by the attempts' run spans up to `now` (overlaps counted once: an in-place
    successor may be recorded running a moment before its predecessor is recorded ended)."""
    intervals = sorted((start, min(end if end is not None else now, now)) for start, end in spans if start is not None)
    total, reach = 0.0, float("-inf")
    for start, end in intervals:
        start = max(start, reach)
        if end > start:
            total += end - start
            reach = end
    return total


def exceeded(
    stopping: dict[str, Any] | None, created_at: float, spans: Iterable[Span], now: float
) -> dict[str, Any] | None:
    """The reason to stop a job whose spec's `stopping` section is `stopping`, created at
    `created_at`, whose attempts ran `spans`, at time `now`; None while both limits hold."""
    stopping = stopping or {}
    max_runtime = float(stopping.get("max_runtime_s") or 86400)
    trained = training_seconds(spans, now)
    if trained > max_runtime:
        limit = STOP_LIMITS[FailureKind.MAX_RUNTIME_EXCEEDED]
        evidence = {"training_s": round(trained, 1), "max_runtime_s": max_runtime}
        message = f"{limit.message} ({trained:.0f} s of training; stopping.max_runtime_s {max_runtime:g})"
        return reason(limit.kind, message, at=now, evidence=evidence)
    max_wait = stopping.get("max_wait_s")
    if max_wait is not None and now - created_at > float(max_wait):
        limit = STOP_LIMITS[FailureKind.MAX_WAIT_EXCEEDED]
        waited = now - created_at
        evidence = {"waited_s": round(waited, 1), "training_s": round(trained, 1), "max_wait_s": max_wait}
        message = f"{limit.message} ({waited:.0f} s since submission; stopping.max_wait_s {max_wait})"
        return reason(limit.kind, message, at=now, evidence=evidence)
    return None
