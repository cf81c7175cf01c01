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

What the step loop waits for is kept small: reused staging buffers and the state's structure worked
out once (`Staging`, `StateCache`: trainer/checkpoint/memory_staging.py). The snapshot file itself
(write, verify and read, restore into the live layout) is trainer/checkpoint/memory_file.py.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from aerie_contracts import env, memckpt
from trainer.checkpoint import dcp
from trainer.checkpoint.interval import AutoInterval, parse_every
from trainer.checkpoint.memory_file import write_snapshot
from trainer.checkpoint.memory_staging import Staging, StateCache

log = logging.getLogger("aerie.trainer.memory")
# This rank's newest snapshots left in shared memory, besides the one the agent protects (the job's
# newest good, memckpt.KEEP_FILE): the agent owns pruning (agent/memckpt/store.py `retain`, within
# memckpt.MAX_HELD); the rank only bounds what an agent that takes nothing would leave.
KEEP_OWN = memckpt.MAX_HELD + 1


@dataclass(frozen=True)
class Written:
    """A snapshot complete in shared memory: what the step loop reports (`checkpoint_memory`)."""

    step: int
    path: Path
    header: memckpt.Header
    blocking_s: float  # the step loop's wait: staging (and any wait for the previous write)
    write_s: float  # serializing and writing it (in the background when asynchronous)


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
