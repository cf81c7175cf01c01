"""Checkpoint layout in S3 and what the manifest records about the attempt that wrote it.

A job's checkpoints live under `<checkpoint.s3_uri>/<job id>/`. Each save of step N by attempt E
(the attempt's number in its job's chain: its *epoch*) goes to its own directory,

    step_<N:08d>/attempt_<E:04d>/   DCP shard files, `.metadata`, then `manifest.json` (the commit)

so two attempts that save the same step (a zombie of attempt 1 finishing its upload while attempt 2
writes step N again) never overwrite or mix objects. A save made outside Aerie (no attempt number)
uses `step_<N:08d>/` itself, the layout before epochs.

The manifest names its writer (`attempt`, `attempt_id`). A checkpoint counts only once the control
plane recorded it, which it does only while the writing attempt is its job's current one (see
docs/architecture.md, "Fencing"); `BAD` is the marker object that flags a checkpoint not to be
resumed from.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping
from typing import Any

from aerie_contracts._strenum import StrEnum
from aerie_contracts.states import CheckpointState

STEP_DIR = "step_{step:08d}"
ATTEMPT_DIR = "attempt_{attempt:04d}"
STEP_RE = re.compile(r"^step_(\d{8,})$")
ATTEMPT_RE = re.compile(r"^attempt_(\d{4,})$")
MANIFEST = "manifest.json"
BAD_MARKER = "BAD"
FORMAT = "aerie.checkpoint/1"

# Keys of manifest.json that name the attempt which committed it.
MANIFEST_ATTEMPT = "attempt"  # the attempt's number (its epoch); absent outside Aerie
MANIFEST_ATTEMPT_ID = "attempt_id"


def step_dir(step: int) -> str:
    return STEP_DIR.format(step=int(step))


def attempt_dir(attempt: int) -> str:
    return ATTEMPT_DIR.format(attempt=int(attempt))


_STEP_IN_URI = re.compile(r"/step_(\d{8,})(?:/|$)")


def step_of_uri(uri: str | None) -> int | None:
    """The step a checkpoint URI (or key) names, from its `step_<N>` directory; None if none."""
    match = _STEP_IN_URI.search("/" + (uri or ""))
    return int(match.group(1)) if match else None


# --- tiers ------------------------------------------------------------------------------------------
# A recorded checkpoint lives in one tier: `s3` (durable, at `checkpoint.every_steps`) or `memory`
# (a snapshot in the nodes' shared memory, replicated to one peer node; see aerie_contracts.memckpt).
# A memory checkpoint's URI is `mem://<job id>/step_<N>/attempt_<E>`: unique per job like an S3 one,
# and `step_of_uri` reads its step.
class CheckpointTier(StrEnum):
    S3 = "s3"
    MEMORY = "memory"


MEMORY_SCHEME = "mem://"


def memory_uri(job_id: str, step: int, attempt: int) -> str:
    return f"{MEMORY_SCHEME}{job_id}/{step_dir(step)}/{attempt_dir(attempt)}"


def tier_of_uri(uri: str) -> CheckpointTier:
    return CheckpointTier.MEMORY if str(uri).startswith(MEMORY_SCHEME) else CheckpointTier.S3


# --- the memory tier's expiry (GC) ------------------------------------------------------------------
# A memory checkpoint is never durable: it is there only while the nodes' shared memory is. Its
# record is marked `deleted` (gone, with the reason) once no restart can use it any more. Applied by
# the store (when a newer checkpoint becomes good, when the job ends), by `chain_restart` (a
# relaunch whose nodes' memory is lost) and by `checkpoint_gc` (a safety net on every S3 commit).
MEMORY_GONE_JOB_ENDED = "the job ended: its nodes removed their shared-memory areas"
MEMORY_GONE_LOST = "relaunched on other nodes: the shared memory that held it is gone"
MEMORY_GONE_ATTEMPT_ENDED = "incomplete when its attempt ended: it can never become good"


def expired_memory(
    rows: Iterable[Mapping[str, Any]],
    *,
    job_over: bool = False,
    ended_attempts: Collection[str] = (),
    lost_attempts: Collection[str] = (),
) -> dict[str, str]:
    """{uri: why} of the memory checkpoints among a job's recorded `rows` (dicts with `uri`,
    `step`, `state`, `tier`, `attempt_id`) that are gone or will never be used, still recorded
    `good` or `incomplete`:

    - all of them once the job is over (`job_over`), and those of `lost_attempts` (a relaunch on
      nodes that do not keep the last attempt's memory);
    - older than the newest good S3 checkpoint: a resume takes S3's then (at the same step the
      memory copy is kept: it restores without a request to S3);
    - older than the newest good memory checkpoint: the agents keep only each rank's newest;
    - incomplete, of an attempt that ended (`ended_attempts`): fenced, it can never become good.
    """
    rows = list(rows)
    memory = [r for r in rows if r.get("tier") == CheckpointTier.MEMORY and r.get("state") in _LIVE]

    def newest_good(tier: CheckpointTier) -> int:
        steps = [int(r["step"]) for r in rows if r.get("tier", CheckpointTier.S3) == tier and r.get("state") == good]
        return max(steps, default=-1)

    good = CheckpointState.GOOD
    good_steps = {tier: newest_good(tier) for tier in (CheckpointTier.S3, CheckpointTier.MEMORY)}
    gone: dict[str, str] = {}
    for row in memory:
        step, uri = int(row["step"]), str(row["uri"])
        if job_over:
            gone[uri] = MEMORY_GONE_JOB_ENDED
        elif row.get("attempt_id") in lost_attempts:
            gone[uri] = MEMORY_GONE_LOST
        elif step < good_steps[CheckpointTier.S3]:
            gone[uri] = f"older than the durable (S3) checkpoint of step {good_steps[CheckpointTier.S3]}"
        elif step < good_steps[CheckpointTier.MEMORY]:
            gone[uri] = f"replaced by the memory checkpoint of step {good_steps[CheckpointTier.MEMORY]}"
        elif row.get("state") == CheckpointState.INCOMPLETE and row.get("attempt_id") in ended_attempts:
            gone[uri] = MEMORY_GONE_ATTEMPT_ENDED
    return gone


_LIVE = frozenset({CheckpointState.GOOD, CheckpointState.INCOMPLETE})
