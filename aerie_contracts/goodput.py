"""The goodput ledger's contract: its categories and the JSON shape the API, CLI and dashboard share;
the Young–Daly checkpoint interval the advice and the trainer's `checkpoint.every_steps: auto` share.

A job's ledger splits its paid time — wall time from submission to end (or now) times its nodes —
into productive step time and badput by cause. Every second of the job's timeline belongs to
exactly one segment, so the parts sum to wall time × nodes by construction.

Shape of `GET /v1/jobs/{job}/goodput` (all durations in node-seconds unless named `_s` of wall):

    {"job_id", "name", "state", "nodes", "start", "end", "wall_s", "node_seconds",
     "goodput": <productive / node_seconds, 0..1>,
     "categories": {<Category>: node-seconds, ...},       # every category, zeros included
     "segments": [{"start", "end", "category", "attempt"}],  # wall-clock, contiguous, coalesced
     "faults": [{"attempt", "kind", "last_step", "last_step_t", "verdict_t", "detection_s",
                 "detected_t", "restart_mode", "recovery_s",   # recovery_s: detected → next first step
                 "resumed_step", "redone_steps", "redone_s"}],
     "advice": [{"tier", ...}]}                            # one per checkpoint tier: `ADVICE_KEYS`
"""

from __future__ import annotations

import math

from aerie_contracts._strenum import StrEnum


class Category(StrEnum):
    PRODUCTIVE = "productive"  # steps trained for the first time
    LAUNCH = "launch"  # submitted/created → the backend says the attempt started (scheduling, provisioning)
    STARTUP = "startup"  # started → first step began (image, rendezvous, model build, data), less restore
    PREFLIGHT = "preflight"  # per-node pre-flight checks (0 until pre-flight runs; kept so dashboards are stable)
    CHECKPOINT_STALL = "checkpoint_stall"  # the synchronous part of saves: steps waiting on a checkpoint
    DETECTION = "detection"  # fault → verdict (or the attempt's end when no detector fired)
    RESTART = "restart"  # teardown and restart: verdict → the next attempt created, and the final teardown
    RESTORE = "restore"  # reading the resume checkpoint before the first step
    REDONE = "redone"  # steps after the resume point that an earlier attempt had already trained
    EVAL = "eval"  # evaluation pauses inside the training loop
    IDLE = "idle"  # paid, nothing explained it: unexplained stalls, waiting for a chain decision


class RestartResume(StrEnum):
    """What an attempt after the first resumed from (the `resume` label of `aerie_restarts_total`;
    its `mode` label is `aerie_contracts.restarts.RestartMode`: in place or relaunched)."""

    CHECKPOINT = "checkpoint"  # resumed from a recorded checkpoint
    SCRATCH = "scratch"  # no checkpoint to resume from: started over


# The heartbeat summary key under which the node's agent reports the slowest of its ranks' restores
# (from their `restored` metrics-stream events, `metrics.MetricEvent.RESTORED`): the ledger's
# `restore` is this measurement when present.
SUMMARY_RESTORE_S = "restore_s"
# ... the step its ranks really resumed at (the lowest of their `restored` events' steps): a memory
# resume point that fell back to S3 resumes earlier than the attempt's `resume_from` says.
SUMMARY_RESTORED_STEP = "restored_step"
# ... and the synchronous cost of its ranks' in-memory snapshots (`checkpoint_memory` events'
# `snapshot_s`): per snapshot the slowest rank's, the median of the recent ones (the memory tier's C).
SUMMARY_SNAPSHOT_S = "snapshot_stall_s"

BADPUT = tuple(c for c in Category if c is not Category.PRODUCTIVE)

# Human labels, in the order tables and the stacked bar show them.
LABELS: dict[str, str] = {
    Category.PRODUCTIVE: "productive steps",
    Category.LAUNCH: "scheduling / launch",
    Category.STARTUP: "start-up to first step",
    Category.PREFLIGHT: "pre-flight",
    Category.CHECKPOINT_STALL: "checkpoint stall",
    Category.DETECTION: "detection delay",
    Category.RESTART: "teardown and restart",
    Category.RESTORE: "restore",
    Category.REDONE: "redone steps",
    Category.EVAL: "eval pauses",
    Category.IDLE: "idle",
}

# Keys of each entry of the ledger's "advice" list (checkpoint-interval advice per checkpoint tier,
# orchestrator/goodput/advice.py).
ADVICE_KEYS = (
    "tier",  # aerie_contracts.checkpoints.CheckpointTier: "s3" | "memory"
    "failures",  # which failures the tier's MTBF counts (the ones it recovers from), in words
    "save_stall_s",  # measured synchronous stall per save (C)
    "mtbf_s",  # mean time between failures of the job's allocation (all its nodes)
    "mtbf_source",  # "fleet" (observed in the store) | "setting" (AERIE_MTBF_H or the default)
    "step_s",  # median step time
    "current_every_steps",
    "current_interval_s",
    "advised_interval_s",  # Young–Daly: sqrt(2 C MTBF)
    "advised_every_steps",
    "current_badput",  # expected fraction of time lost to saves + redone work at the current interval
    "advised_badput",
)


def young_daly(save_stall_s: float, mtbf_s: float) -> float:
    """√(2·C·MTBF): the checkpoint interval (seconds of training between saves) that wastes least
    (Young 1974; Daly 2006), for a synchronous stall C per save and failures every MTBF seconds."""
    if not save_stall_s > 0 or not mtbf_s > 0:
        raise ValueError("the save stall and the MTBF must be positive")
    return math.sqrt(2.0 * save_stall_s * mtbf_s)


def expected_waste(interval_s: float, save_stall_s: float, mtbf_s: float) -> float:
    """Expected share of time lost to saves and redone work at `interval_s` (first order):
    C/τ for saving, τ/(2·MTBF) for the half interval a failure costs on average."""
    if not interval_s > 0:
        raise ValueError("the interval must be positive")
    return save_stall_s / interval_s + interval_s / (2.0 * mtbf_s)
