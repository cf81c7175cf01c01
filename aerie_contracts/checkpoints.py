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
