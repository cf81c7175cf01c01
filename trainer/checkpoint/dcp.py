"""Save and load the trainer's full state with torch.distributed.checkpoint (DCP).

What one checkpoint holds (keys of the DCP state dict):
- `model`, `optim`: from `torch.distributed.checkpoint.state_dict.get_state_dict`, so DDP and
  FSDP2 (DTensor shards) both work and a checkpoint does not depend on the wrapper;
- `train_state`: pickled scheduler state and the caller's `extra_state` (step, consumed samples,
  tokens: the data position), one copy;
- `rng_rank_<R>`: pickled RNG states of rank R (torch CPU, CUDA, python, numpy).

Where: `file://...` or a plain path (FileSystemWriter/Reader), `s3://...` through
`trainer.checkpoint.s3io` (streamed; nothing staged on local disk).

Asynchronous saves (`dcp.async_save`): the caller blocks only while the state is copied to CPU
(pinned memory on GPU); shards are written by a background thread on a process group of its own
(gloo), so they never interleave with the training loop's collectives. `Checkpointer` wraps this
for the training loop: `checkpoint_begin` when a save starts, `checkpoint_staged` (with `stall_s`)
when the synchronous copy is done and training resumes, `checkpoint_end` (with `stall_s`,
`upload_s`, `save_s`) when this rank's write finished (or failed, with `error`), and on rank 0
`manifest.commit(...)` then `checkpoint_committed` with the `uri`. DCP gathers every rank's write
result at rank 0 before its future completes, so rank 0's completion means every rank finished writing. A failed save
commits nothing (the manifest is the commit point); training goes on and the next interval tries
again. Under Aerie each save goes to its attempt's own directory (`step_N/attempt_E/`) and the
commit is fenced (`aerie_checkpoint.fence`): a superseded attempt's commit never counts, and
the `Checkpointer` then says so (`superseded`), which stops the training loop.
"""

from __future__ import annotations

import io
import logging
import os
import pickle
import random
import subprocess
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from aerie_checkpoint import manifest
from aerie_checkpoint.storage import is_s3, local_path
from aerie_contracts import env
from aerie_contracts import metrics as keys
from aerie_contracts.metrics import MetricEvent
from trainer.checkpoint import s3io

log = logging.getLogger(__name__)

MODEL, OPTIM, TRAIN_STATE = "model", "optim", "train_state"


def _rng_key(rank: int) -> str:
    return f"rng_rank_{rank:05d}"


def step_uri(base: str, step: int, attempt: int | None = None) -> str:
    """Where `attempt` (its epoch; None outside Aerie) saves `step` (aerie_contracts.checkpoints)."""
    return manifest.checkpoint_uri(base, step, attempt)


def _writer(uri: str, thread_count: int):
    if not is_s3(uri):
        Path(local_path(uri)).mkdir(parents=True, exist_ok=True)
    return s3io.storage_writer(uri, thread_count=thread_count)


def _reader(uri: str):
    return s3io.storage_reader(uri)


# --- RNG -----------------------------------------------------------------------------------------


def rng_state() -> bytes:
    state = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    buf = io.BytesIO()
    torch.save(state, buf)
    return buf.getvalue()


def set_rng_state(blob: bytes) -> None:
    state = torch.load(io.BytesIO(blob), weights_only=False)
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


# --- save / load ---------------------------------------------------------------------------------


def state_to_save(model, optimizer, scheduler, extra_state: dict[str, Any]) -> dict[str, Any]:
    model_sd, optim_sd = get_state_dict(model, optimizer)
    return {MODEL: model_sd, OPTIM: optim_sd, **train_and_rng_state(scheduler, extra_state)}


def train_and_rng_state(scheduler, extra_state: dict[str, Any]) -> dict[str, Any]:
    """The part of `state_to_save` beside the model and the optimizer: scheduler + extra, this rank's RNG."""
    train_state = {"scheduler": scheduler.state_dict() if scheduler is not None else None, "extra": dict(extra_state)}
    rank = dist.get_rank() if dist.is_initialized() else 0
    return {TRAIN_STATE: pickle.dumps(train_state), _rng_key(rank): rng_state()}


def _stager(on_gpu: bool):
    """Synchronous staging to CPU memory (pinned on GPU): the only part a training step waits for."""
    from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

    return DefaultStager(
        StagingOptions(
            use_pinned_memory=on_gpu, use_shared_memory=False, use_async_staging=False, use_non_blocking_copy=False
        )
    )


def save(
    uri: str,
    model,
    optimizer,
    scheduler,
    extra_state: dict[str, Any],
    *,
    async_: bool = True,
    process_group: dist.ProcessGroup | None = None,
    thread_count: int = 4,
) -> Future:
    """Save the full state to `uri`. Returns a future done when this rank's part is written
    (already done when `async_` is False). Asynchronous saves need `process_group` to be a gloo group
    that the training loop does not use (see `Checkpointer`)."""
    state = state_to_save(model, optimizer, scheduler, extra_state)
    writer = _writer(uri, thread_count)
    if not async_:
        dcp.save(state, storage_writer=writer, process_group=process_group)
        done: Future = Future()
        done.set_result(None)
        return done
    on_gpu = any(t.is_cuda for t in _tensors(state))
    stager = _stager(on_gpu)
    future = dcp.async_save(state, storage_writer=writer, process_group=process_group, async_stager=stager)
    future.add_done_callback(lambda _: stager.close())
    return future


def _tensors(obj):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _tensors(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _tensors(v)


def load(uri: str, model, optimizer, scheduler, *, process_group: dist.ProcessGroup | None = None) -> dict[str, Any]:
    """Restore model, optimizer, scheduler and this rank's RNG from `uri`; return the extra state."""
    reader = _reader(uri)
    saved_keys = {key.split(".", 1)[0] for key in reader.read_metadata().state_dict_metadata}
    model_sd, optim_sd = get_state_dict(model, optimizer)
    rank = dist.get_rank() if dist.is_initialized() else 0
    state: dict[str, Any] = {MODEL: model_sd, OPTIM: optim_sd, TRAIN_STATE: b""}
    if _rng_key(rank) in saved_keys:  # absent when resuming with a larger world
        state[_rng_key(rank)] = b""
    dcp.load(state, storage_reader=_reader(uri), process_group=process_group)
    set_state_dict(model, optimizer, model_state_dict=state[MODEL], optim_state_dict=state[OPTIM])
    train_state = pickle.loads(state[TRAIN_STATE])
    if scheduler is not None and train_state["scheduler"] is not None:
        scheduler.load_state_dict(train_state["scheduler"])
    if _rng_key(rank) in state:
        set_rng_state(state[_rng_key(rank)])
    else:
        log.warning("checkpoint %s has no RNG state for rank %d; RNG not restored", uri, rank)
    return train_state["extra"]


# --- the training loop's checkpointer --------------------------------------------------------------


def code_version() -> str:
    """What code wrote a checkpoint: $AERIE_CODE_VERSION, else the git commit of the checkout."""
    if os.environ.get(env.CODE_VERSION):
        return os.environ[env.CODE_VERSION]
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            cwd=Path(__file__).resolve().parent,
        )
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return "unknown"


def describe_error(error: BaseException) -> str:
    """One line per failed rank (DCP wraps every rank's exception, with tracebacks, in one)."""
    failures = getattr(error, "failures", None)
    if isinstance(failures, dict) and failures:
        causes = []
        for rank, failure in sorted(failures.items()):
            exc = failure[0] if isinstance(failure, tuple) else failure
            exc = getattr(exc, "exc", exc)
            causes.append(f"rank {rank}: {type(exc).__name__}: {exc}")
        return "; ".join(causes)
    return f"{type(error).__name__}: {error}"


@dataclass
class _Pending:
    uri: str
    step: int
    tokens: int
    metrics: dict[str, Any]
    started: float
    stall_s: float | None = None  # the synchronous part, once it is over
    done: threading.Event = field(default_factory=threading.Event)
    ok: bool = False
    committed: bool = False


class Checkpointer:
    """Periodic asynchronous checkpoints of one training run, with commit and metrics events.

    Construct it on every rank (it creates the checkpoint process group collectively). At most one
    save is in flight: starting one waits for the previous (normally long done).
    """

    def __init__(
        self,
        base_uri: str | None,
        every_steps: int,
        metrics,
        *,
        world: dict[str, Any],
        config_hash: str,
        async_: bool = True,
        thread_count: int = 4,
        attempt: int | None = None,
        attempt_id: str = "",
        gate=None,
    ) -> None:
        self.base_uri = base_uri
        # The attempt's epoch goes into every key it writes; the gate fences its commits.
        self.attempt = attempt
        self.attempt_id = attempt_id
        self.gate = gate
        # Why this attempt's commits are refused (the control plane moved on), once it is known.
        self.superseded: str | None = None
        self.every_steps = every_steps if base_uri else 0
        self.metrics = metrics
        self.world = world
        self.config_hash = config_hash
        self.async_ = async_
        self.thread_count = thread_count
        self.rank = dist.get_rank()
        # Background writes get their own gloo group: DCP's collectives then never interleave
        # with the step loop's, and an NCCL-only default group still gets the CPU backend DCP needs.
        self.group = dist.new_group(backend="gloo")
        self._pending: _Pending | None = None
        self._code_version = code_version() if self.rank == 0 else ""
        self.last_committed: str | None = None
        # This rank's last save: the loop's stall, and its whole duration once done (`every_steps: auto`).
        self.last_stall_s: float | None = None
        self.last_save_s: float | None = None

    def due(self, step: int) -> bool:
        return self.every_steps > 0 and step % self.every_steps == 0

    def save(
        self,
        step: int,
        model,
        optimizer,
        scheduler,
        extra_state: dict[str, Any],
        metrics_at_step: dict[str, Any] | None = None,
    ) -> None:
        """Start saving `step` (blocks for the copy only). Never raises: a failed save is reported."""
        assert self.base_uri, "no checkpoint location"
        self.wait()
        uri = step_uri(self.base_uri, step, self.attempt)
        pending = _Pending(
            uri=uri,
            step=step,
            tokens=int(extra_state.get("tokens", 0)),
            metrics=dict(metrics_at_step or {}),
            started=time.time(),
        )
        self._pending = pending
        self.metrics.event(MetricEvent.CHECKPOINT_BEGIN, step, **{keys.URI: uri})
        try:
            future = save(
                uri,
                model,
                optimizer,
                scheduler,
                extra_state,
                async_=self.async_,
                process_group=self.group,
                thread_count=self.thread_count,
            )
        except (Exception, CheckpointException) as exc:  # staging or planning failed: report, keep training
            self._finish(pending, exc)
            return
        # The training loop resumes now; the upload (if any) runs beside the next steps. The agent
        # times the two parts as separate sections: a stall suspends step-hang detection, an
        # upload does not.
        pending.stall_s = self.last_stall_s = time.time() - pending.started
        self.metrics.event(MetricEvent.CHECKPOINT_STAGED, step, **{keys.URI: uri, keys.STALL_S: pending.stall_s})
        future.add_done_callback(lambda f: self._finish(pending, f.exception()))

    def _finish(self, pending: _Pending, error: BaseException | None) -> None:
        """Runs in the writer thread when this rank's part is done (or failed)."""
        try:
            seconds = time.time() - pending.started
            stall = seconds if pending.stall_s is None else pending.stall_s
            timing = {keys.URI: pending.uri, keys.SAVE_S: seconds, keys.STALL_S: stall, keys.UPLOAD_S: seconds - stall}
            if error is not None:
                log.error("checkpoint %s failed (training continues): %s", pending.uri, describe_error(error))
                self.metrics.event(
                    MetricEvent.CHECKPOINT_END, pending.step, ok=False, error=describe_error(error)[:500], **timing
                )
                return
            pending.ok = True
            self.last_save_s = seconds
            self.metrics.event(MetricEvent.CHECKPOINT_END, pending.step, ok=True, **timing)
            if self.rank == 0:
                self._commit(pending)
        finally:
            pending.done.set()

    def _commit(self, pending: _Pending) -> None:
        from aerie_checkpoint import fence

        try:
            written = fence.commit(
                pending.uri,
                self.gate,
                step=pending.step,
                tokens=pending.tokens,
                world=self.world,
                config_hash=self.config_hash,
                code_version=self._code_version,
                metrics=pending.metrics,
                attempt=self.attempt,
                attempt_id=self.attempt_id,
            )
        except fence.Superseded as exc:
            self.superseded = str(exc)
            log.error("checkpoint %s not committed: this attempt was superseded (%s)", pending.uri, exc)
            return
        except Exception as exc:
            log.error("manifest commit of %s failed; the checkpoint is not good: %s", pending.uri, exc)
            return
        pending.committed = True
        self.last_committed = pending.uri
        self.metrics.event(
            MetricEvent.CHECKPOINT_COMMITTED,
            pending.step,
            **{
                keys.URI: pending.uri,
                keys.SAVE_S: time.time() - pending.started,
                keys.SIZE_BYTES: written["total_bytes"],
            },
        )

    def poll(self) -> bool:
        """Non-blocking: whether no save is in flight."""
        return self._pending is None or self._pending.done.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the in-flight save (and its commit) finished; False on timeout. When it has
        to block, says so first (`checkpoint_wait`): the agent then knows that no step runs
        because the loop waits for the upload, whose own limit applies."""
        pending = self._pending
        if pending is None:
            return True
        if not pending.done.is_set():
            self.metrics.event(MetricEvent.CHECKPOINT_WAIT, pending.step, **{keys.URI: pending.uri})
        return pending.done.wait(timeout)

    def load(self, uri: str, model, optimizer, scheduler) -> dict[str, Any]:
        return load(uri, model, optimizer, scheduler, process_group=self.group)
