"""Where a run resumes from and what it belongs to: restoring a checkpoint of either tier (with the
fall-back to an older good one, marking the failed ones bad), the attempt's fencing, and the
in-memory tier's snapshotter."""

from __future__ import annotations

import logging
import os
from typing import Any

import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException

from aerie_contracts import env
from aerie_contracts.checkpoints import MEMORY_SCHEME, CheckpointTier, step_of_uri, tier_of_uri
from trainer.checkpoint.dcp import Checkpointer, describe_error

log = logging.getLogger("trainer.resume")


def restore(checkpointer: Checkpointer, uri: str, model, optimizer, scheduler) -> tuple[dict, str]:
    """Load `uri`; if it cannot be restored (corrupt, incomplete), fall back to the newest older
    good checkpoint under the same prefix (as the control plane records them, when there is one),
    and say so. Every rank sees the same failure (DCP gathers read errors), so every rank falls
    back to the same checkpoint. Once a fallback restored, the storage evidently works, so the
    ones that failed are the checkpoints' fault: rank 0 marks them bad (a `BAD` marker, and the
    control plane's record), so no later attempt tries them again."""
    from trainer.checkpoint import manifest

    if tier_of_uri(uri) == CheckpointTier.MEMORY:
        return restore_memory(uri, model, optimizer, scheduler), uri
    failed: list[tuple[str, str]] = []
    while True:
        try:
            extra = checkpointer.load(uri, model, optimizer, scheduler)
        except (Exception, CheckpointException) as exc:
            ref = manifest.parse_uri(uri)
            if ref is None:
                raise
            recorded = checkpointer.gate.recorded() if checkpointer.gate is not None else None
            older = [c for c in manifest.list_checkpoints(ref.prefix, recorded) if c.good and c.ref.key < ref.key]
            if not older:
                raise
            failed.append((uri, describe_error(exc)))
            log.error(
                "cannot restore %s (%s); falling back to the previous good checkpoint %s",
                uri,
                failed[-1][1],
                older[-1].uri,
            )
            uri = older[-1].uri
            continue
        if failed and dist.get_rank() == 0:
            mark_bad(checkpointer, failed, uri)
        return extra, uri


def restore_memory(uri: str, model, optimizer, scheduler) -> dict:
    """Resume from a memory checkpoint (`mem://<job>/step_<N>/...`): this rank's snapshot of step N
    in the node's shared memory, verified. The agent puts it there first (its own copy, or the
    peer's replica fetched over TCP: agent.memckpt.restore) and names S3 instead when neither
    verifies; a snapshot that still fails here is an error, never a silent partial restore."""
    from aerie_contracts import memckpt
    from trainer.checkpoint import memory

    step = step_of_uri(uri)
    if step is None:
        raise ValueError(f"{uri}: a memory checkpoint URI names its step (mem://<job>/step_<N>/attempt_<E>)")
    job = uri.removeprefix(MEMORY_SCHEME).split("/", 1)[0]
    rank = dist.get_rank() if dist.is_initialized() else 0
    path = memckpt.local_dir(None, job) / memckpt.file_name(step, rank)
    header, extra = memory.load_snapshot(path, model, optimizer, scheduler)
    if header.step != step or int(extra.get("step", -1)) != step:
        raise memckpt.SnapshotError(f"{path}: holds step {header.step}, the resume point is step {step}")
    return extra


def mark_bad(checkpointer: Checkpointer, failed: list[tuple[str, str]], restored: str) -> None:
    from trainer.checkpoint import manifest

    for uri, error in failed:
        reason = f"restore failed: {error[:500]} (resumed from {restored} instead)"
        try:
            manifest.mark_bad(uri, reason)
        except Exception as exc:  # the record below still tells the control plane
            log.warning("could not write the BAD marker of %s: %s", uri, exc)
        if checkpointer.gate is not None:
            checkpointer.gate.mark_bad(uri, reason)


def fencing_of_attempt() -> dict[str, Any]:
    """The attempt this run belongs to, from its node's environment: its number is the epoch in
    the checkpoint keys, and its commits go through the control plane's gate. Nothing outside Aerie."""
    from trainer.checkpoint.fence import CommitGate

    number = os.environ.get(env.ATTEMPT_NUMBER, "")
    return {
        "attempt": int(number) if number.isdigit() else None,
        "attempt_id": os.environ.get(env.ATTEMPT, ""),
        "gate": CommitGate.from_env(),
    }


def memory_snapshotter(rank: int):
    """The in-memory tier's snapshots (issue #22), when `AERIE_MEMORY_CHECKPOINT_EVERY` asks for
    them inside an Aerie job. No backend sets it yet: the agent's replication loop and the area's
    cleanup are not wired, and snapshots nobody replicates or removes would only fill /dev/shm."""
    from trainer.checkpoint.memory import MemorySnapshotter

    job, number = os.environ.get(env.JOB, ""), os.environ.get(env.ATTEMPT_NUMBER, "")
    if not job or not number.isdigit():
        return None
    return MemorySnapshotter.from_env(job=job, attempt=int(number), rank=rank)
