"""The in-memory checkpoint tier, trainer side: a rank's snapshot into the node's shared memory.

Every `memory_every_steps` steps (or as often as `interval.AutoInterval` finds affordable) a rank writes
the same state an S3 checkpoint holds (`trainer.checkpoint.dcp.state_to_save`: model, optimizer,
scheduler + data position, this rank's RNG) as one `torch.save` stream into a snapshot file of
`aerie_contracts.memckpt` in `/dev/shm` (no disk), header last: a rank killed mid-write leaves a
file the agent and the restore both recognise as torn. The node agent (agent/memckpt) keeps the
newest complete snapshot per rank and replicates it to one peer node.

Sharded state (FSDP2 DTensors) is saved as each rank's local shard and restored into the same
layout (same world and parallelism, which is what an in-place restart or a replaced node has).

Asynchronous by default: the step loop waits only while the state's tensors are copied into
staging buffers (host memory, reused from one snapshot to the next; pinned, with one device sync,
on a GPU); a background thread serializes the copy into the snapshot file (CRC as it goes, header
last). One write at a time: a snapshot due while the last one is still being written first waits
for it (the buffers are in use). The copies are exact, so a resume from either is bitwise the same.

What the step loop waits for is kept small: the staging buffers are allocated once and reused, and
the state's structure (`get_state_dict`'s walk of the model and the optimizer to name every tensor,
which costs more than copying a small model's tensors) is worked out once and kept (`StateCache`):
later snapshots rebuild the dicts from the live tensors by the names found the first time, as long
as the model's parameters and the optimizer's state are the same tensors (checked every time, by
identity and storage; otherwise it is worked out again).
"""

from __future__ import annotations

import io
import logging
import os
import pickle
import threading
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from aerie_contracts import env, memckpt
from trainer.checkpoint import dcp
from trainer.checkpoint.interval import AutoInterval, parse_every

log = logging.getLogger("aerie.trainer.memory")
# This rank's newest snapshots left in shared memory, besides the one the agent protects (the job's
# newest good, memckpt.KEEP_FILE): the agent owns pruning (agent/memckpt/store.py `retain`, within
# memckpt.MAX_HELD); the rank only bounds what an agent that takes nothing would leave.
KEEP_OWN = memckpt.MAX_HELD + 1


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


def _local(obj: Any) -> Any:
    """The state with DTensors replaced by their local shards (plain tensors as they are)."""
    from torch.distributed.tensor import DTensor

    if isinstance(obj, DTensor):
        return obj.to_local()
    if isinstance(obj, dict):
        return {k: _local(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_local(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_local(v) for v in obj)
    return obj


def _into(template: Any, saved: Any) -> Any:
    """`saved` in the live state's layout: a shard copied into its DTensor, a tensor onto its device."""
    from torch.distributed.tensor import DTensor

    if isinstance(template, DTensor) and isinstance(saved, torch.Tensor):
        template.to_local().copy_(saved)
        return template
    if isinstance(template, torch.Tensor) and isinstance(saved, torch.Tensor):
        return saved.to(template.device)
    if isinstance(template, dict) and isinstance(saved, dict):
        return {k: _into(template.get(k), v) for k, v in saved.items()}
    if isinstance(template, (list, tuple)) and isinstance(saved, (list, tuple)) and len(template) == len(saved):
        return type(saved)(_into(t, v) for t, v in zip(template, saved, strict=True))
    return saved


class Staging:
    """Host copies of a state's tensors, reused from one snapshot to the next: the state handed to
    the background writer, which training may change meanwhile. Containers are rebuilt (an
    optimizer's param groups change under a scheduler), tensors copied bit for bit into buffers
    kept by position (reallocated when a shape or dtype changes), and tensors that share memory
    (tied weights) share one buffer, as `torch.save` would have kept them."""

    def __init__(self) -> None:
        self._buffers: list[torch.Tensor] = []
        self._next = 0
        self._memo: dict[tuple, torch.Tensor] = {}
        self._device = False

    def copy(self, state: Any) -> Any:
        self._next, self._memo, self._device = 0, {}, False
        staged = self._walk(_local(state))
        if self._device:
            torch.cuda.synchronize()  # the non-blocking device-to-host copies are done
        self._memo = {}
        return staged

    def _buffer(self, like: torch.Tensor) -> torch.Tensor:
        i = self._next
        self._next += 1
        if i < len(self._buffers):
            buf = self._buffers[i]
            if buf.shape == like.shape and buf.dtype == like.dtype:
                return buf
        buf = torch.empty(like.shape, dtype=like.dtype, device="cpu", pin_memory=like.is_cuda)
        if i < len(self._buffers):
            self._buffers[i] = buf
        else:
            self._buffers.append(buf)
        return buf

    def _walk(self, obj: Any) -> Any:
        if isinstance(obj, torch.Tensor):
            key = (
                obj.untyped_storage().data_ptr(),
                obj.storage_offset(),
                tuple(obj.shape),
                tuple(obj.stride()),
                obj.dtype,
                str(obj.device),
            )
            if key in self._memo:
                return self._memo[key]
            buf = self._buffer(obj)
            buf.copy_(obj.detach(), non_blocking=obj.is_cuda)
            self._device = self._device or obj.is_cuda
            self._memo[key] = buf
            return buf
        if isinstance(obj, dict):
            return {k: self._walk(v) for k, v in obj.items()}
        if isinstance(obj, list):
            return [self._walk(v) for v in obj]
        if isinstance(obj, tuple):
            return tuple(self._walk(v) for v in obj)
        return obj


class StateCache:
    """`dcp.state_to_save` without redoing `get_state_dict` at every snapshot.

    The first call does the full walk and remembers the model's state dict (its tensors share
    storage with the live parameters and buffers: updated in place, they stay current) and the
    optimizer's parameter names. Later calls, while the fingerprint holds (the same parameter,
    buffer and optimizer-state tensors, by identity and storage), rebuild the optimizer's dict
    from its live state (tensor values, updated in place; other values read afresh) and param
    groups (lr and the rest read afresh) under those names: the same dict `get_state_dict` gives.
    """

    def __init__(self) -> None:
        self._key: tuple | None = None
        self._model_sd: dict[str, Any] = {}
        self._names: dict[int, str] = {}  # id(parameter) -> its name in the optimizer's dict
        self._group_names: list[list[str]] = []

    @staticmethod
    def _fingerprint(model, optimizer) -> tuple:
        def tensor(t: Any) -> tuple:
            return (id(t), t.data_ptr()) if isinstance(t, torch.Tensor) else (None, None)

        return (
            tuple(tensor(p) for p in model.parameters()),
            tuple(tensor(b) for b in model.buffers()),
            tuple((id(p), tuple((k, *tensor(v)) for k, v in st.items())) for p, st in optimizer.state.items()),
            tuple(tuple(id(p) for p in g["params"]) for g in optimizer.param_groups),
        )

    def state(self, model, optimizer, scheduler, extra_state: dict[str, Any]) -> dict[str, Any]:
        key = self._fingerprint(model, optimizer)
        if key != self._key:
            state = dcp.state_to_save(model, optimizer, scheduler, extra_state)
            groups = state[dcp.OPTIM].get("param_groups", [])
            live = optimizer.param_groups
            names = [list(g.get("params", [])) for g in groups]
            if len(names) == len(live) and all(len(n) == len(g["params"]) for n, g in zip(names, live, strict=True)):
                self._key, self._model_sd, self._group_names = key, state[dcp.MODEL], names
                self._names = {id(p): n for g, ns in zip(live, names, strict=True) for p, n in zip(g["params"], ns)}
            else:
                self._key = None  # a layout this cache does not know: the full walk every time
            return state
        optim_sd = {
            "state": {self._names[id(p)]: dict(st) for p, st in optimizer.state.items()},
            "param_groups": [
                {**{k: v for k, v in g.items() if k != "params"}, "params": list(names)}
                for g, names in zip(optimizer.param_groups, self._group_names, strict=True)
            ],
        }
        return {dcp.MODEL: dict(self._model_sd), dcp.OPTIM: optim_sd, **dcp.train_and_rng_state(scheduler, extra_state)}


@dataclass(frozen=True)
class Written:
    """A snapshot complete in shared memory: what the step loop reports (`checkpoint_memory`)."""

    step: int
    path: Path
    header: memckpt.Header
    blocking_s: float  # the step loop's wait: staging (and any wait for the previous write)
    write_s: float  # serializing and writing it (in the background when asynchronous)


def write_snapshot(
    path: str | os.PathLike[str], state: dict[str, Any], *, job: str, attempt: int, step: int, rank: int
) -> memckpt.Header:
    """Write `state` as one snapshot file at `path`: payload first, header last."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.write(b"\0" * memckpt.HEADER_SIZE)  # reserved: a reader sees no header until the end
        writer = _CrcWriter(f)
        torch.save(_local(state), writer)
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
        model_state_dict=_into(model_sd, state[dcp.MODEL]),
        optim_state_dict=_into(optim_sd, state[dcp.OPTIM]),
    )
    train_state = pickle.loads(state[dcp.TRAIN_STATE])
    if scheduler is not None and train_state["scheduler"] is not None:
        scheduler.load_state_dict(train_state["scheduler"])
    rng = [k for k in state if k.startswith("rng_rank_")]
    if rng:
        dcp.set_rng_state(state[rng[0]])
    return train_state["extra"]


class MemorySnapshotter:
    """One rank's periodic snapshots into the node's shared-memory area.

    `every` is a step count, None for `auto` (see `AutoInterval`) or 0 (off). The training loop
    calls `observe_step(seconds)` after each step and `maybe_snapshot(...)` after it; both are cheap
    when nothing is due. `finished()` hands over the snapshots completed since it was last called
    (what the loop reports), `close()` waits for the one being written. `async_=False` writes in
    the step loop, as before staging existed, and `cache_state=False` walks the state with
    `get_state_dict` at every snapshot, as before `StateCache` (the bench's comparisons).
    """

    def __init__(
        self,
        *,
        job: str,
        attempt: int,
        rank: int,
        every: int | None,
        root: str | os.PathLike[str] | None = None,
        auto: AutoInterval | None = None,
        async_: bool = True,
        cache_state: bool = True,
    ) -> None:
        self.job, self.attempt, self.rank = job, attempt, rank
        self.every = every
        self.auto = (auto or AutoInterval()) if every is None else None
        self.dir = memckpt.local_dir(root, job)
        self.async_ = async_
        self.last: memckpt.Header | None = None
        self.last_cost_s: float | None = None  # the step loop's wait for the last snapshot
        self.last_write_s: float = 0.0  # the last completed write's own time
        self._staging = Staging()
        self._state = StateCache() if cache_state else None
        self._writer: threading.Thread | None = None
        self._done: list[Written] = []
        self._lock = threading.Lock()

    @classmethod
    def from_env(cls, *, job: str, attempt: int, rank: int) -> MemorySnapshotter | None:
        every = parse_every(os.environ.get(env.MEMORY_CHECKPOINT_EVERY))
        return None if every == 0 else cls(job=job, attempt=attempt, rank=rank, every=every)

    def observe_step(self, seconds: float) -> None:
        if self.auto is not None:
            self.auto.observe_step(seconds)

    def due(self, step: int) -> bool:
        if self.auto is not None:
            return self.auto.due(step)
        return bool(self.every) and step % int(self.every) == 0

    def path(self, step: int) -> Path:
        return self.dir / memckpt.file_name(step, self.rank)

    def snapshot(
        self, step: int, model, optimizer, scheduler, extra_state: dict[str, Any], *, group=None
    ) -> memckpt.Header | None:
        """Snapshot this rank's state of `step`: staged now, written in the background (returns
        None; `finished()` reports it), or written now with `async_=False` (returns its header).
        With `auto` and a process group (a CPU one: gloo), the ranks agree on the cost and step
        time (MAX) so they keep snapshotting the same steps. That cost is the step loop's wait
        plus the last write's own time: on a CPU the writer competes with training for the cores,
        so `auto` stays within its budget even then."""
        started = time.perf_counter()
        self.wait()  # one write at a time: its buffers are about to be reused
        if self._state is not None:
            state = self._state.state(model, optimizer, scheduler, extra_state)
        else:
            state = dcp.state_to_save(model, optimizer, scheduler, extra_state)
        header = None
        if self.async_:
            staged = self._staging.copy(state)
            blocking_s = time.perf_counter() - started
            self._writer = threading.Thread(
                target=self._write, args=(step, staged, blocking_s), name="memckpt-writer", daemon=True
            )
            self._writer.start()
        else:
            written = self._write(step, state, None, started=started)
            header = written.header if written is not None else None
            blocking_s = time.perf_counter() - started
        self.last_cost_s = blocking_s
        if self.auto is not None:
            cost = blocking_s + (self.last_write_s if self.async_ else 0.0)
            measured = torch.tensor([cost, self.auto.local_step_s()], dtype=torch.float64)
            if group is not None:
                import torch.distributed as dist

                dist.all_reduce(measured, op=dist.ReduceOp.MAX, group=group)
            self.auto.observe_snapshot(step, float(measured[0]), float(measured[1]))
        return header

    def _write(
        self, step: int, state: dict[str, Any], blocking_s: float | None, *, started: float | None = None
    ) -> Written | None:
        t0 = time.perf_counter() if started is None else started
        try:
            header = write_snapshot(
                self.path(step), state, job=self.job, attempt=self.attempt, step=step, rank=self.rank
            )
            self._prune()
        except Exception:  # a snapshot missed costs a fast restart, never the training
            log.exception("memory snapshot of step %d (rank %d) failed", step, self.rank)
            self.path(step).unlink(missing_ok=True)
            return None
        write_s = time.perf_counter() - t0
        written = Written(step, self.path(step), header, write_s if blocking_s is None else blocking_s, write_s)
        with self._lock:
            self.last, self.last_write_s = header, write_s
            self._done.append(written)
        return written

    def wait(self, timeout: float | None = None) -> None:
        """Until the snapshot being written is complete (or `timeout` passed)."""
        writer = self._writer
        if writer is not None:
            writer.join(timeout)
            if not writer.is_alive():
                self._writer = None

    def finished(self) -> list[Written]:
        """The snapshots completed since the last call, oldest first."""
        with self._lock:
            done, self._done = self._done, []
        return done

    def close(self, timeout: float | None = None) -> list[Written]:
        """Wait for the snapshot being written; returns what `finished` would."""
        self.wait(timeout)
        return self.finished()

    def maybe_snapshot(self, step: int, model, optimizer, scheduler, extra_state: dict[str, Any], *, group=None):
        if not self.due(step):
            return None
        return self.snapshot(step, model, optimizer, scheduler, extra_state, group=group)

    def _prune(self) -> None:
        """Drop this rank's oldest snapshots beyond KEEP_OWN, never the one the agent protects."""
        keep = memckpt.read_keep(self.dir)
        own = sorted(
            (parsed[1], p)
            for p in self.dir.iterdir()
            if (parsed := memckpt.parse_name(p.name)) is not None and parsed[0] == self.rank and parsed[1] != keep
        )
        for _, p in own[:-KEEP_OWN]:
            p.unlink(missing_ok=True)
