"""The probe's state inside one rank: what the hooks saw, turned into records (torch-agnostic here).

`hooks.py` calls the `on_*` methods from torch's hooks; this module keeps the step's accumulators,
builds the step records, opens and closes the sections, and runs a daemon thread that flushes the
batched records, reads a GPU loss once its copy has landed, and notices an evaluation.

Step numbers: an optimizer step is a step. The first optimizer that steps is the one counted
(a GAN's second optimizer, or a second param-group optimizer, would double the count); its own
restored step count is the number where it has one (Adam's `state[p]["step"]` on the CPU), so a
resumed run continues its numbering; otherwise (SGD keeps none) a process-local counter from the
step of the checkpoint the attempt resumes from (`AERIE_RESUME_FROM`'s `step_<N>`, the one Aerie
restored for the trainer), else from 1.

The loss is the mean of the scalars `backward()` was called on since the last step (gradient
accumulation's micro-batches). On the CPU it is read at the step; on a GPU the mean is copied
non-blocking and read when its CUDA event has completed (`query()`, never `synchronize()`), so
the step's record is written a step (or a thread tick) later. A loss scaled by AMP's GradScaler is
reported scaled (the probe cannot tell it from a real one).

Evaluation: forward passes with no backward for longer than `max(EVAL_AFTER_S, 3 x the last
step)` after a training step open an eval section (`eval_begin`, dated at the first such forward);
the next backward or step closes it. Shorter evaluations stay inside a step's time. A hang must
never pass for an evaluation (a section suspends the agent's hang detection), so an eval needs
forwards that go on: a second forward after the first (a rank blocked inside its first forward,
e.g. in FSDP's all-gather, has none), no backward begun (a rank blocked in DDP's all-reduce is
inside `backward()`), not inside a collective; and it ends once no forward began for
`max(EVAL_STALE_S, 3 x the last step)` (the hang clock then runs again).

Errors: `fail` turns the probe off for good and prints one line on stderr; the hooks stay
installed but pass straight through.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from aerie_contracts import byo, env
from aerie_contracts import metrics as keys
from aerie_contracts import probe as contract
from aerie_contracts.checkpoints import step_of_uri
from aerie_contracts.metrics import MetricEvent

from .sink import FLUSH_S, Sink

EVAL_AFTER_S = 2.0
EVAL_STALE_S = 10.0  # an inferred eval with no forward begun this long is no eval (a hang inside one)
OWN_STEP_EVERY = 32  # optimizer steps between two reads of the optimizer's own step count
TICK_S = 0.25


def _record_s() -> float:
    """`AERIE_PROBE_RECORD_S` where it is a number >= 0, else the contract's RECORD_S."""
    try:
        value = float(os.environ.get(env.PROBE_RECORD_S) or contract.RECORD_S)
    except ValueError:
        return contract.RECORD_S
    return value if value >= 0 else contract.RECORD_S


def _off_in_child(ref: weakref.ref[Probe]) -> None:
    probe = ref()
    if probe is not None:
        probe.on = False


class Probe:
    def __init__(self, rank_of: Callable[[], int] | None = None) -> None:
        self.on = True
        self.sink = Sink()
        self.rank_of = rank_of or (lambda: int(os.environ.get("RANK", "0")))
        self.primary: weakref.ref[Any] | None = None
        self.train_thread = threading.main_thread().ident
        self.count = 0  # primary optimizer steps in this process
        self._own_read_at: int | None = None  # the count when the optimizer's own step was last read
        self._own_offset = 0  # its own step minus the count then (none kept, e.g. SGD: the resumed step)
        self.priming = 0  # inside DCP's optimizer-state priming (hooks._priming_hooks): no step
        self.step: int | None = None
        self._exited = False  # `exiting` ran
        self.last_end = time.monotonic()
        self.last_step_s = 0.0
        self.acc = dict.fromkeys(("backward_s", "optimizer_s", "data_s", "collective_s", "save_s"), 0.0)
        self.step_collectives = 0
        self.record_s = _record_s()
        self.last_record = -float("inf")  # monotonic time of the last step record
        self.folded = 0  # steps since the last step record (folded into the next one)
        self.fold_s = [0.0, 0.0]  # their step times: sum, longest
        self.fold_losses: list[Any] = []  # the newest folded step's losses (for a record forced out)
        self.rearm: Callable[[], None] | None = None  # arms the global forward hook (hooks._FirstForward)
        self.forwards: Any = None  # that hook's keeper (hooks._FirstForward), kept for a resumed install
        self._stopped = False  # closed: the thread ends
        self.in_backward = False  # inside backward() (activation checkpointing calls modules there)
        self.collectives = 0
        self.in_collective: str | None = None
        self.losses: list[Any] = []
        self.pending: tuple[dict[str, Any], Any, Any] | None = None  # (record, host copy of the loss, its event)
        self._pending_lock = threading.Lock()
        self.fwd_first = 0.0  # wall time of the first forward since the last backward/step
        self.fwd_last = 0.0  # wall time of the last forward begun (a root module's, hooks._FirstForward)
        self.in_eval = False
        self.saving = 0
        self._thread: threading.Thread | None = None
        atexit.register(self.close)
        # Off in a forked child (a DataLoader worker) at once: the hooks then never ask for the pid
        # (a system call) on the step path. Weakly: a process that makes many probes keeps none.
        ref = weakref.ref(self)
        os.register_at_fork(after_in_child=lambda: _off_in_child(ref))

    # ------------------------------------------------------------------ plumbing

    def fail(self, exc: BaseException) -> None:
        self._stopped = True
        if self.on:
            self.on = False
            print(f"aerie probe: off after an error in a hook ({type(exc).__name__}: {exc})", file=sys.stderr)

    def ready(self) -> bool:
        """Files open for this rank (claimed by the process with something to say); False in a
        forked child (a DataLoader worker): the probe stays out of it (`_off_in_child` turned it
        off at the fork; the pid is compared here only off the step path)."""
        if not self.on:
            return False
        if self.sink.rank is None:
            if os.getpid() != self.sink.pid:
                self.on = False
                return False
            self.claim()
        return True

    def claim(self, rank: int | None = None) -> None:
        self.sink.claim(self.rank_of() if rank is None else rank)
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="aerie-probe", daemon=True)
            self._thread.start()

    def _record(self, event: str | None = None, **extra: Any) -> dict[str, Any]:
        rec: dict[str, Any] = dict.fromkeys(keys.CONTRACT_KEYS)
        rec.update({keys.T: round(time.time(), 3), keys.RANK: self.sink.rank, keys.EVENT: event})
        rec[byo.SOURCE_KEY] = byo.SOURCE_PROBE
        rec.update(extra)
        return rec

    def event(self, event: str, t: float | None = None, **extra: Any) -> None:
        rec = self._record(event, **extra)
        if t is not None:
            rec[keys.T] = round(t, 3)
        self.sink.add(rec, now=True)

    # ------------------------------------------------------------------ what the hooks report

    def on_forward(self) -> None:
        now = time.time()
        self.fwd_last = now
        if self.fwd_first == 0.0:
            self.fwd_first = now

    def on_backward_begin(self) -> None:
        """A backward began: training, not an evaluation (and a rank blocked in DDP's all-reduce is
        blocked inside it, with no forward after)."""
        self.fwd_first = 0.0
        self.in_backward = True
        if self.in_eval:
            self._end_eval()

    def on_backward(self, loss: Any, seconds: float) -> None:
        self.in_backward = False
        self.acc["backward_s"] += seconds
        self.fwd_first = 0.0
        if loss is not None:
            self.losses.append(loss)
        if self.in_eval:
            self._end_eval()

    def on_collective(self, name: str | None, seconds: float = 0.0) -> None:
        """`name` on entry, None on exit (with the time it took)."""
        if not self.ready():
            return
        if name is not None:
            self.collectives += 1
            self.step_collectives += 1
        else:
            self.acc["collective_s"] += seconds
        self.in_collective = name
        self.sink.state(self.collectives, name, self.step)

    def on_data(self, seconds: float) -> None:
        self.acc["data_s"] += seconds

    def save_begin(self) -> bool:
        """True when this save opens a section (the outermost, on the training thread)."""
        if self.saving or threading.get_ident() != self.train_thread or not self.ready():
            return False  # nested in a save already open (dcp.save's own writes), or off the loop
        self.saving = 1
        self.flush_fold()
        self.sink.flush()
        self.event(MetricEvent.CHECKPOINT_BEGIN)
        return True

    def save_end(self, seconds: float, ok: bool, uri: str | None, staged: bool = False) -> None:
        self.saving = 0
        self.acc["save_s"] += seconds
        if staged:  # an async save's synchronous part is over; its end comes from its future
            staged_fields: dict[str, Any] = {keys.STALL_S: round(seconds, 4), keys.URI: uri}
            self.event(MetricEvent.CHECKPOINT_STAGED, **staged_fields)
        else:
            times = {keys.STALL_S: round(seconds, 4), keys.SAVE_S: round(seconds, 4)}
            end_fields: dict[str, Any] = {keys.OK: ok, keys.URI: uri, **times}
            self.event(MetricEvent.CHECKPOINT_END, **end_fields)

    def on_step(self, optimizer: Any, seconds: float, own_step: Callable[[Any], int | None]) -> dict[str, Any] | None:
        """An optimizer step ended. Returns the step's record (its loss still to be filled in when
        the hooks copy it from a device), or None for a step that is not counted or is folded into
        the next record (`aerie_contracts.probe.RECORD_S`: a loop faster than that pays for one
        record, not one per step). `own_step(optimizer)` reads the optimizer's own count (Adam's restored
        `state["step"]`): read at the first step and every `OWN_STEP_EVERY` steps after (a tensor
        read per step was a third of the probe's cost), the steps between numbered on from it."""
        if self.priming:
            return None  # a zero-gradient step that fills the optimizer's state before a restore
        primary = self.primary() if self.primary is not None else None
        if primary is None:
            self.primary, primary = weakref.ref(optimizer), optimizer
            self.train_thread = threading.get_ident()
        self.acc["optimizer_s"] += seconds
        if primary is not optimizer or not self.ready():
            return None
        now = time.monotonic()
        self.count += 1
        if self._own_read_at is None or self.count - self._own_read_at >= OWN_STEP_EVERY:
            own = own_step(optimizer)
            self._own_read_at = self.count
            # Read now, not when torch was imported: a warm rank (agent.warm) imported it before
            # the go file gave it this attempt's environment.
            resumed_at = step_of_uri(os.environ.get(env.RESUME_FROM)) or 0  # the restored checkpoint's step
            self._own_offset = resumed_at if own is None else own - self.count
        self.step = self.count + self._own_offset
        # The first step's time since the probe started is the script's setup too: not a step's.
        step_s: float | None = now - self.last_end if self.count > 1 else None
        self.last_end, self.last_step_s = now, step_s or 0.0
        self.folded += 1
        if step_s is not None:
            fold = self.fold_s
            fold[0] += step_s
            if step_s > fold[1]:
                fold[1] = step_s
        self.fwd_first = 0.0
        if self.in_eval:
            self._end_eval()
        if step_s is not None and now - self.last_record < self.record_s:
            # Folded: the next record stands for this step too. Its losses are kept only as the
            # newest folded step's (a record forced out before the next step: `flush_fold`),
            # detached: kept into the next step, a loss's graph (`retain_graph=True`) would be too.
            losses = self.losses
            if losses:
                self.fold_losses = [losses[0].detach()] if len(losses) == 1 else [x.detach() for x in losses]
                self.losses = []
            else:
                self.fold_losses = []
            return None
        return self._step_record(now, optimizer)

    def _step_record(self, now: float, optimizer: Any) -> dict[str, Any]:
        """The record of the steps since the last one (the newest step's number; see RECORD_S)."""
        n, (total_s, longest_s) = self.folded, self.fold_s
        timed = n if self.count > n else n - 1  # the first step has no step time
        acc = self.acc
        spent = sum(acc[k] for k in ("backward_s", "optimizer_s", "data_s", "collective_s", "save_s"))

        def mean(x: float) -> float:  # a phase's time per step
            return round(x / n, 6)

        rest = None if timed == 0 else round(max(0.0, total_s / timed - spent / n), 6)
        groups = getattr(optimizer, "param_groups", None)
        raw_lr = groups[0].get("lr") if groups else None
        lr = float(raw_lr) if isinstance(raw_lr, (int, float)) else None  # a tensor lr may live on a device
        fields: dict[str, Any] = {
            keys.STEP: self.step,
            keys.LR: lr,
            keys.STEP_S: None if timed == 0 else round(longest_s, 6),
            contract.FORWARD_S: rest,
            contract.BACKWARD_S: mean(acc["backward_s"]),
            contract.OPTIMIZER_S: mean(acc["optimizer_s"]),
            contract.DATA_S: mean(acc["data_s"]),
            contract.COLLECTIVES: self.step_collectives if n == 1 else round(self.step_collectives / n, 3),
            contract.COLLECTIVE_S: mean(acc["collective_s"]),
            contract.FOLDED: n,
        }
        rec = self._record(**fields)
        for k in acc:
            acc[k] = 0.0
        self.step_collectives = 0
        self.folded, self.fold_s = 0, [0.0, 0.0]
        self.fold_losses = []
        self.last_record = now
        self.sink.state(self.collectives, self.in_collective, self.step)
        return rec

    def flush_fold(self) -> None:
        """Write the record of steps folded since the last one now (a save begins, the rank exits):
        the agent's last step is the rank's. Their loss from the CPU only (no device read here)."""
        if not self.folded or self.step is None:
            return
        losses = self.fold_losses
        rec = self._step_record(time.monotonic(), self.primary() if self.primary is not None else None)
        cpu = [x for x in losses if getattr(getattr(x, "device", None), "type", None) == "cpu"]
        loss = sum(float(x.detach().item()) for x in cpu) / len(cpu) if cpu and len(cpu) == len(losses) else None
        self.emit_step(rec, loss)

    def emit_step(self, rec: dict[str, Any], loss: float | None) -> None:
        rec[keys.LOSS] = rec[keys.LOCAL_LOSS] = loss
        self.sink.add(rec)

    def defer_step(self, rec: dict[str, Any], host: Any, done: Any) -> None:
        """A step whose loss is still being copied from the device: written once `done.query()`."""
        self.resolve(force=True)
        with self._pending_lock:
            self.pending = (rec, host, done)

    def resolve(self, force: bool = False, wait: bool = False) -> None:
        """Write the pending step if its loss has landed (or regardless, with `force`: its loss
        null, or read after waiting for it with `wait`, only at exit)."""
        with self._pending_lock:
            if self.pending is None:
                return
            rec, host, done = self.pending
            if wait:
                done.synchronize()
            landed = done.query()
            if not landed and not force:
                return
            self.pending = None
        self.emit_step(rec, float(host) if landed else None)

    # ------------------------------------------------------------------ eval sections, the thread

    def _end_eval(self) -> None:
        self.in_eval = False
        self.event(MetricEvent.EVAL_END)

    def _maybe_eval(self) -> None:
        first = self.fwd_first
        if self.in_eval:
            if time.time() - self.fwd_last > max(EVAL_STALE_S, 3 * self.last_step_s):
                self._end_eval()  # no forward goes on: whatever this is, it is no evaluation
                self.fwd_first = 0.0  # a later forward may begin another
            return
        if not first or self.count == 0 or self.fwd_last <= first or self.in_collective is not None:
            return
        if time.time() - first > max(EVAL_AFTER_S, 3 * self.last_step_s):
            self.in_eval = True
            self.event(MetricEvent.EVAL_BEGIN, t=first)

    def tick(self) -> None:
        if not self.on:
            return
        quiet = time.monotonic() - self.last_end > 2 * TICK_S
        if self.rearm is not None and self.count and quiet and not (self.fwd_first or self.in_backward):
            # No step for a while and no known model's forward since the last one, not inside a
            # backward: the first module called next is a model never seen (an evaluation's own).
            # Never armed in the middle of a forward or of a backward's recomputation, where the
            # first module called would be a known model's child.
            self.rearm()
        self.resolve()
        self._maybe_eval()
        if time.monotonic() - self.sink.last_flush >= FLUSH_S:
            self.sink.flush()

    def _run(self) -> None:
        while not self._stopped:  # idle while off but not stopped (hooks.uninstall(keep))
            time.sleep(TICK_S)
            if not self.on:
                continue
            try:
                self.tick()
            except Exception as exc:
                self.fail(exc)

    def exiting(self, failed: bool = False) -> None:
        """The script's code is done (its interpreter exits): after a rank that trained, a
        `train_end` event (once), so the agent judges what follows (a final save, the process
        group's teardown, the interpreter's finalization: over 12 s on a loaded host) as a
        wind-down with its own limit, not as a hang between steps. Not when an exception ends it."""
        if self._exited or not self.on or os.getpid() != self.sink.pid:
            return
        self._exited = True
        if failed or self.step is None:
            return
        self.resolve(force=True, wait=True)  # the last step's record before the event
        self.flush_fold()
        self.event(MetricEvent.TRAIN_END, **{keys.STEP: self.step})

    def close(self) -> None:
        if not self.on or os.getpid() != self.sink.pid:
            return
        self._stopped = True
        try:
            self.exiting(failed=sys.exc_info()[0] is not None or getattr(sys, "last_value", None) is not None)
            self.resolve(force=True, wait=True)
            self.flush_fold()
            if self.in_eval:
                self._end_eval()
            self.sink.close()
        except Exception as exc:
            self.fail(exc)
