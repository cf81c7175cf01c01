"""Where a run resumes from and what it belongs to: restoring a checkpoint of either tier (with the
fall-back to an older good one, marking the failed ones bad), the attempt's fencing, and the
in-memory tier's snapshotter."""

from __future__ import annotations

import logging
import os
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException

from aerie_contracts import env
from aerie_contracts.checkpoints import MEMORY_SCHEME, CheckpointTier, step_of_uri, tier_of_uri
from trainer.checkpoint.dcp import Checkpointer, describe_error

log = logging.getLogger("trainer.resume")


def restore(checkpointer: Checkpointer, uri: str, model, optimizer, scheduler) -> tuple[dict | None, str]:
    """Load `uri`; if it cannot be restored (corrupt, incomplete), fall back to the newest older
    good checkpoint under the same prefix (as the control plane records them, when there is one),
    and say so. Every rank sees the same failure (DCP gathers read errors), so every rank falls
    back to the same checkpoint. Once a fallback restored, the storage evidently works, so the
    ones that failed are the checkpoints' fault: rank 0 marks them bad (a `BAD` marker, and the
    control plane's record), so no later attempt tries them again."""
    from aerie_checkpoint import manifest

    if tier_of_uri(uri) == CheckpointTier.MEMORY:
        extra, uri = restore_memory(uri, model, optimizer, scheduler)
        if extra is not None or not uri:
            return extra, uri
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


def read_memory(uri: str) -> tuple[dict | None, str]:
    """This rank's snapshot of a memory checkpoint (`mem://<job>/step_<N>/...`) from the node's
    shared memory, verified (header complete, payload CRC-32, the step it names): (state, "") or
    (None, why not). The agent left it there: its own copy, or the peer's replica it fetched."""
    from aerie_contracts import memckpt
    from trainer.checkpoint import memory_file

    step = step_of_uri(uri)
    if step is None:
        raise ValueError(f"{uri}: a memory checkpoint URI names its step (mem://<job>/step_<N>/attempt_<E>)")
    job = uri.removeprefix(MEMORY_SCHEME).split("/", 1)[0]
    rank = dist.get_rank() if dist.is_initialized() else 0
    path = memckpt.local_dir(None, job) / memckpt.file_name(step, rank)
    try:
        header, state = memory_file.read_snapshot(path)
    except (memckpt.SnapshotError, OSError) as exc:
        return None, f"rank {rank}: {exc}"
    if header.step != step:
        return None, f"rank {rank}: {path} holds step {header.step}, the resume point is step {step}"
    return state, ""


def everyone(ok: bool) -> bool:
    """True when `ok` holds on every rank (a MIN all-reduce): the ranks must all take one resume
    point, or their states would belong to different steps."""
    if not dist.is_initialized():
        return ok
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else None
    flag = torch.tensor([1 if ok else 0], dtype=torch.int32, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


def restore_memory(uri: str, model, optimizer, scheduler) -> tuple[dict | None, str]:
    """Resume from a memory checkpoint if every rank's snapshot verifies; else every rank takes the
    durable fallback (`AERIE_RESUME_FALLBACK`, S3) instead, or starts from scratch without one:
    (extra state or None for scratch, the URI restored). A torn or corrupt snapshot is never used."""
    from trainer.checkpoint import memory_file

    state, why = read_memory(uri)
    if everyone(state is not None):
        assert state is not None
        return memory_file.apply_snapshot(state, model, optimizer, scheduler), uri
    fallback = env.RESUME_FALLBACK.get() or ""
    log.warning(
        "memory checkpoint %s not restored (%s): every rank resumes from %s instead",
        uri,
        why or "another rank's snapshot failed",
        fallback or "scratch",
    )
    return None, fallback


def mark_bad(checkpointer: Checkpointer, failed: list[tuple[str, str]], restored: str) -> None:
    from aerie_checkpoint import manifest

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
    from aerie_checkpoint.fence import CommitGate

    number = os.environ.get(env.ATTEMPT_NUMBER, "")
    return {
        "attempt": int(number) if number.isdigit() else None,
        "attempt_id": os.environ.get(env.ATTEMPT, ""),
        "gate": CommitGate.from_env(),
    }


def memory_snapshotter(rank: int):
    """The in-memory tier's snapshots (issue #22), when `AERIE_MEMORY_CHECKPOINT_EVERY` asks for
    them inside an Aerie job (the backend sets it where the node agents replicate and clean up:
    recovery.modes.memory_tier_off)."""
    from trainer.checkpoint.memory import MemorySnapshotter

    job, number = os.environ.get(env.JOB, ""), os.environ.get(env.ATTEMPT_NUMBER, "")
    if not job or not number.isdigit():
        return None
    return MemorySnapshotter.from_env(job=job, attempt=int(number), rank=rank)
