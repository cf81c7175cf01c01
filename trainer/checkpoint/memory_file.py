"""A rank's in-memory snapshot as a file of `aerie_contracts.memckpt`: written, read and put back.

The payload is one `torch.save` stream of the rank's state (sharded state as its local shards),
written after a zeroed header block and checksummed on the way; the header goes last, so a rank
killed mid-write leaves a file the agent and the restore both recognise as torn. Reading verifies
header and CRC before anything is loaded; a restore copies each shard back into the live layout
(same world and parallelism). The snapshotter that decides when is trainer/checkpoint/memory.py.
"""

from __future__ import annotations

import io
import os
import pickle
import zlib
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from aerie_contracts import memckpt
from trainer.checkpoint import dcp


class _CrcWriter:
    """A file object for `torch.save` that checksums what passes through (no second read)."""

    def __init__(self, f) -> None:
        self.f = f
        self.crc = 0
        self.size = 0

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        self.crc = zlib.crc32(view, self.crc)
        self.size += len(view)
        return self.f.write(view)

    def flush(self) -> None:
        self.f.flush()


def local_shards(obj: Any) -> Any:
    """The state with DTensors replaced by their local shards (plain tensors as they are)."""
    from torch.distributed.tensor import DTensor

    if isinstance(obj, DTensor):
        return obj.to_local()
    if isinstance(obj, dict):
        return {k: local_shards(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [local_shards(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(local_shards(v) for v in obj)
    return obj


def into_live(template: Any, saved: Any) -> Any:
    """`saved` in the live state's layout: a shard copied into its DTensor, a tensor onto its device."""
    from torch.distributed.tensor import DTensor

    if isinstance(template, DTensor) and isinstance(saved, torch.Tensor):
        template.to_local().copy_(saved)
        return template
    if isinstance(template, torch.Tensor) and isinstance(saved, torch.Tensor):
        return saved.to(template.device)
    if isinstance(template, dict) and isinstance(saved, dict):
        return {k: into_live(template.get(k), v) for k, v in saved.items()}
    if isinstance(template, (list, tuple)) and isinstance(saved, (list, tuple)) and len(template) == len(saved):
        return type(saved)(into_live(t, v) for t, v in zip(template, saved, strict=True))
    return saved


def write_snapshot(
    path: str | os.PathLike[str], state: dict[str, Any], *, job: str, attempt: int, step: int, rank: int
) -> memckpt.Header:
    """Write `state` as one snapshot file at `path`: payload first, header last."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.write(b"\0" * memckpt.HEADER_SIZE)  # reserved: a reader sees no header until the end
        writer = _CrcWriter(f)
        torch.save(local_shards(state), writer)
        f.flush()
        header = memckpt.Header(job=job, attempt=attempt, step=step, rank=rank, size=writer.size, crc32=writer.crc)
        memckpt.write_header(f.fileno(), header)
    return header


def read_snapshot(path: str | os.PathLike[str]) -> tuple[memckpt.Header, dict[str, Any]]:
    """Verify (header complete, payload checksum) and load a snapshot; raises `SnapshotError`."""
    header = memckpt.verify(path)
    with open(path, "rb") as f:
        f.seek(memckpt.HEADER_SIZE)
        payload = f.read(header.size)
    if len(payload) != header.size or zlib.crc32(payload) != header.crc32:  # changed since verify
        raise memckpt.CorruptSnapshot(f"{path}: payload changed while reading")
    return header, torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)


def load_snapshot(path: str | os.PathLike[str], model, optimizer, scheduler) -> tuple[memckpt.Header, dict[str, Any]]:
    """Restore model, optimizer, scheduler and this rank's RNG from a verified snapshot; returns
    its header and the caller's extra state (step, consumed samples, tokens)."""
    header, state = read_snapshot(path)
    return header, apply_snapshot(state, model, optimizer, scheduler)


def apply_snapshot(state: dict[str, Any], model, optimizer, scheduler) -> dict[str, Any]:
    """Put a read snapshot's state into model, optimizer, scheduler and this rank's RNG; returns
    the caller's extra state."""
    model_sd, optim_sd = get_state_dict(model, optimizer)
    set_state_dict(
        model,
        optimizer,
        model_state_dict=into_live(model_sd, state[dcp.MODEL]),
        optim_state_dict=into_live(optim_sd, state[dcp.OPTIM]),
    )
    train_state = pickle.loads(state[dcp.TRAIN_STATE])
    if scheduler is not None and train_state["scheduler"] is not None:
        scheduler.load_state_dict(train_state["scheduler"])
    rng = [k for k in state if k.startswith("rng_rank_")]
    if rng:
        dcp.set_rng_state(state[rng[0]])
    return train_state["extra"]
