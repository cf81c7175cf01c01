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

from aerie_contracts._strenum import StrEnum

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
