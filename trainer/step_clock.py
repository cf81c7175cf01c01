"""How a rank spent a step: its own work (`compute_s`) vs blocked in collectives (`wait_s`).

Ranks run in lockstep, so every rank's step takes the same wall time and a slow rank (a slow or
throttled accelerator, a rank that sleeps) hides behind its peers: they simply wait for it. What
differs is where the time goes, and the rank that waits least is the slow one. The control plane
compares `compute_s` across ranks and nodes (orchestrator/straggler.py).

Measured, not modelled:

* DDP: a communication hook wraps the gradient all-reduce (the same all-reduce as DDP's default
  hook) and records when this rank launched its last bucket (its backward was done) and when the
  last bucket completed (every peer had contributed). The difference is the time this rank's
  backward waited for its peers' (plus the transfer, which is the same on every rank).
* Any explicit collective the loop times with `collective()` (the per-step loss gather).

FSDP2 all-gathers weights inside forward and backward; they are not timed, so under FSDP2 a fast
rank's wait is counted as its compute and only the loss gather's wait is seen: stragglers then
show through less (still no false ones). On CUDA the hook's completion callback runs when the
all-reduce is enqueued rather than finished, so on GPUs the DDP wait is a lower bound.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

import torch
import torch.distributed as dist


class StepClock:
    """One per rank. `begin()` at the top of each step, `split(step_s)` at the end."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._launch = 0.0  # perf_counter of this step's last bucket launch
        self._done = 0.0  # ... and of its last completion
        self._explicit = 0.0  # seconds inside timed collectives this step

    def attach(self, model: torch.nn.Module) -> torch.nn.Module:
        """Time DDP's gradient all-reduce (a no-op for other wrappers)."""
        if hasattr(model, "register_comm_hook") and hasattr(model, "no_sync"):
            model.register_comm_hook(None, self._allreduce_hook)
        return model

    def _allreduce_hook(self, state, bucket):  # no annotation: DDP compares it with the real Future[Tensor]
        """DDP's default hook (average by world size, all-reduce), with the two timestamps."""
        launched = time.perf_counter()
        with self._lock:
            self._launch = max(self._launch, launched)
        tensor = bucket.buffer()
        tensor.div_(dist.get_world_size())
        fut = dist.all_reduce(tensor, async_op=True).get_future()

        def done(f: torch.futures.Future) -> torch.Tensor:
            finished = time.perf_counter()
            with self._lock:
                self._done = max(self._done, finished)
            return f.value()[0]

        return fut.then(done)

    def begin(self) -> None:
        with self._lock:
            self._launch = self._done = self._explicit = 0.0

    @contextlib.contextmanager
    def collective(self) -> Iterator[None]:
        """Time a blocking collective of the step loop as waiting."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            with self._lock:
                self._explicit += time.perf_counter() - t0

    def split(self, step_s: float) -> tuple[float, float]:
        """(compute_s, wait_s) of the step that took `step_s` (wait never exceeds the step)."""
        with self._lock:
            grad_wait = self._done - self._launch if self._launch and self._done >= self._launch else 0.0
            wait = min(step_s, max(0.0, grad_wait) + self._explicit)
        return step_s - wait, wait
