"""torch's side of the probe: the global hooks, installed once the user's script imported torch.

- optimizer steps: `torch.optim.optimizer.register_optimizer_step_pre_hook`/`_post_hook` (every
  optimizer, whatever creates it: a Lightning or HF loop, a plain script);
- the loss: `torch.autograd.backward` is wrapped (`Tensor.backward` calls it), and a scalar it is
  called on is kept, detached, for the step's record (runtime.py says how it is read);
- collectives: `torch.distributed`'s Python functions (`COLLECTIVES`), in both namespaces, counted
  and timed per rank, the outermost call only. DDP's gradient all-reduce is issued by its C++
  reducer and never passes through Python: it is not counted (its time is in `backward_s`); NCCL
  and `async_op=True` calls are timed to their enqueue, not their completion;
- input wait: `DataLoader`'s iterator `__next__`;
- saves: `torch.save`, `torch.distributed.checkpoint.save`/`async_save` and `safetensors.torch.save_file`
  (how HF's `save_pretrained` writes the model) once the script imports them, open a checkpoint
  section (`async_save` is staged when it returns and ends with its future);
- state priming: `torch.distributed.checkpoint.state_dict` fills an empty optimizer's state with
  one `step()` on zero gradients before it loads a checkpoint into it (`_init_optim_state`); that
  step is not a training step (counted, it made a resumed attempt's first step 1, not its resume
  step + 1), so the probe leaves it out;
- forward passes: a global forward pre-hook notes the first forward since the last backward (how
  an evaluation is noticed; the module it fires on, the model, keeps a hook of its own, so an
  evaluation's later forwards are seen, and a backward's beginning is noted: runtime.py says why
  a hang never passes for an eval), then removes itself until the next backward or step (`_FirstForward`):
  any global module hook takes every module call off `Module.__call__`'s fast path, which cost
  Aerie's tiny trainer 80 % of its step (bench/probe.py, 2026-12-03) while it stayed registered.
  Under `torch.compile` the hook is traced like any module hook.

Every wrapper calls the original first-class (its exceptions propagate untouched) and runs its own
bookkeeping guarded: the first error turns the probe off (runtime.Probe.fail). The hooks a step
always passes (optimizer, backward, input, a model's forward) guard inline and call the probe
directly, one call each where they can: with `_guard` and a lambda around each, a step paid about
25 calls, which measurably slowed Lightning's millisecond step (bench/probe.py, 2026-12-04).
"""

from __future__ import annotations

import atexit
import functools
import importlib
import sys
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from .runtime import Probe

COLLECTIVES = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "broadcast",
    "broadcast_object_list",
    "barrier",
    "reduce",
    "all_to_all",
    "all_to_all_single",
    "gather",
    "scatter",
)
SCAN_PARAMS = 64  # how many params the step count is looked for in (frozen ones have no state)
# Steps after which the global forward hook is no longer armed at every step (the models are
# known by then, each with a hook of its own); after them the probe's thread arms it only when the
# loop has gone quiet (an evaluation of a module never seen before is found that way). Armed at
# every step it cost Lightning's millisecond step about 3 %: a hook call, a registration and a
# removal, each a few microseconds with the caches cold (bench/probe.py, 2026-12-03).
DISCOVER_STEPS = 32

PROBE: Probe | None = None
_UNDO: list[Callable[[], object]] = []  # what `uninstall` runs, newest first


def _replace(owner: Any, name: str, new: Any) -> None:
    """`owner.name = new`, undone by `uninstall`."""
    old = getattr(owner, name)
    setattr(owner, name, new)
    _UNDO.append(lambda: setattr(owner, name, old))


def _guard(fn: Callable[..., Any], *args: Any) -> Any:
    probe = PROBE
    if probe is None or not probe.on:
        return None
    try:
        return fn(*args)
    except Exception as exc:
        probe.fail(exc)
        return None


def install(
    torch: Any, when_imported: Callable[[str, Callable[[Any], None]], None] | None = None, resume: Probe | None = None
) -> Probe:
    """Install every hook (once per process); `when_imported(name, fn)` defers the hooks of a
    module the script has not imported yet (the sitecustomize's import watch). `resume`: a probe
    `uninstall(keep=True)` returned, on again with its state (its count, files, known models)."""
    global PROBE
    if PROBE is not None:
        return PROBE
    dist = torch.distributed if torch.distributed.is_available() else None

    def rank_of() -> int:
        if dist is not None and dist.is_initialized():
            return int(dist.get_rank())
        import os

        return int(os.environ.get("RANK", "0"))

    if resume is not None:
        PROBE = probe = resume
        probe.on = True
        first_forward = probe.forwards if isinstance(probe.forwards, _FirstForward) else _FirstForward(torch, probe)
        first_forward.rewatch()
    else:
        PROBE = probe = Probe(rank_of)
        first_forward = _FirstForward(torch, probe)
    _optimizer_hooks(torch, probe, first_forward)
    _backward_hook(torch, probe, first_forward)
    _save_hooks(torch)
    _data_hook(torch)
    first_forward.arm()
    _UNDO.append(first_forward.disarm)
    if dist is not None:
        _collective_hooks(torch, dist, probe)
        if when_imported is not None:
            when_imported("torch.distributed.checkpoint", _dcp_hooks)
            when_imported("torch.distributed.checkpoint.state_dict", _priming_hooks)
    if when_imported is not None:
        when_imported("safetensors.torch", _safetensors_hooks)
    return probe


def uninstall(keep: bool = False) -> Probe | None:
    """Undo `install`: every hook removed, every function it wrapped restored, the probe closed (its
    records written) and off; a later `install` starts a new probe, or with `keep` goes on with
    this one (returned: `install(..., resume=it)`, its state and files as they were, its thread
    idle meanwhile). For measuring the probe against its absence inside one process
    (bench/probe.py): call it between steps, never from inside a hook (torch iterates its hook
    dictionaries while it calls them)."""
    global PROBE
    probe, PROBE = PROBE, None
    while _UNDO:
        _UNDO.pop()()
    if probe is not None:
        if not keep:
            probe._exited = True  # the script goes on: no `train_end`
            probe.close()
        probe.on = False
    return probe


class _FirstForward:
    """A global forward pre-hook registered only while the first forward since the last backward
    or step is awaited: it fires once, tells the probe, and removes itself (`Module.__call__`
    copies the global hooks before calling them, so a hook may remove itself). The module it
    fired on (the outermost one called: the model) gets a forward pre-hook of its own, one module's
    call off the fast path, so every later forward of the model is seen too (an evaluation's go on;
    a hang inside one forward does not)."""

    ROOTS = 8  # modules watched at most (a model, its loss module, a separately called embedding, ...)

    def __init__(self, torch: Any, probe: Probe) -> None:
        self._register = torch.nn.modules.module.register_module_forward_pre_hook
        self._probe = probe
        self._handle: Any = None
        self._roots: weakref.WeakSet[Any] = weakref.WeakSet()
        self._root_handles: list[Any] = []
        self._lock = threading.Lock()  # the probe's thread arms too (`Probe.rearm`)
        probe.rearm = self.arm
        probe.forwards = self

    def arm(self) -> None:
        """Register the global hook unless it is (the loop's thread, or the probe's: `Probe.rearm`)."""
        with self._lock:
            if self._handle is None and self._probe.on:
                self._handle = self._register(self._fired)

    def disarm(self) -> None:
        """Every forward hook of the probe's removed (`uninstall`)."""
        handles, self._root_handles = [self._handle, *self._root_handles], []
        self._handle = None
        for handle in handles:
            if handle is not None:
                handle.remove()

    def rewatch(self) -> None:
        """The known models' own hooks again (after `disarm`: a resumed probe)."""
        for module in list(self._roots):
            self._hook(module)

    def _hook(self, module: Any) -> None:
        """A known model's own forward pre-hook: every forward of it is seen."""
        self._root_handles.append(module.register_forward_pre_hook(self._root_forward))

    def _root_forward(self, _module: Any, _args: Any) -> None:
        # On every forward of a model: `Probe.on_forward` inline, one call on the step path.
        probe = self._probe
        if probe.on:
            now = time.time()
            probe.fwd_last = now
            if not probe.fwd_first:
                probe.fwd_first = now

    def _fired(self, module: Any, _args: Any) -> None:
        with self._lock:
            handle, self._handle = self._handle, None
        try:
            if handle is not None:
                handle.remove()
        except Exception:  # never into the trainer; the hook is off the path either way
            pass
        # A module is watched while the models are being found, or later when no forward began
        # since the last step (the probe's thread armed the hook in a quiet loop): then it is a
        # model never seen (an evaluation's own), not a known model's child (a known model's own
        # hook, which runs after the global ones, would have noted a forward already: such a
        # child's call is no forward of its own either).
        probe = self._probe
        if probe.count <= DISCOVER_STEPS or not probe.fwd_first or module in self._roots:
            _guard(self._watch, module)
            _guard(probe.on_forward)

    def _watch(self, module: Any) -> None:
        if module not in self._roots and len(self._roots) < self.ROOTS:
            self._roots.add(module)
            self._hook(module)


def own_step(optimizer: Any) -> int | None:
    """The optimizer's own step count (Adam's `state[p]["step"]`), where it is on the CPU."""
    state, seen = optimizer.state, 0
    for group in optimizer.param_groups:
        for p in group["params"]:
            seen += 1
            entry = state.get(p)
            if entry:
                step = entry.get("step")
                if step is None:
                    return None
                if hasattr(step, "device"):
                    return int(step.item()) if step.device.type == "cpu" else None
                return int(step)
            if seen >= SCAN_PARAMS:
                return None
    return None


def _optimizer_hooks(torch: Any, probe: Probe, first_forward: _FirstForward) -> None:
    optim = importlib.import_module("torch.optim.optimizer")
    started: dict[int, float] = {}

    # Registered as they are, each guarded inline: a step pays two calls, not six (a wrapper and
    # `_guard` around each cost Lightning's millisecond step a measurable share, bench/probe.py).
    def pre(optimizer: Any, _args: Any, _kwargs: Any) -> None:
        if probe.on:
            started[id(optimizer)] = time.perf_counter()

    def post(optimizer: Any, _args: Any, _kwargs: Any) -> None:
        if not probe.on:
            return
        try:
            seconds = time.perf_counter() - started.pop(id(optimizer), time.perf_counter())
            rec = probe.on_step(optimizer, seconds, own_step)
            if probe.count <= DISCOVER_STEPS:
                first_forward.arm()
            if rec is not None:
                _loss_into(torch, probe, rec)
        except Exception as exc:
            probe.fail(exc)

    _UNDO.append(optim.register_optimizer_step_pre_hook(pre).remove)
    _UNDO.append(optim.register_optimizer_step_post_hook(post).remove)


def _loss_into(torch: Any, probe: Probe, rec: dict[str, Any]) -> None:
    """Fill the step's loss: at once from the CPU, a step later from a CUDA device, else none."""
    losses, probe.losses = probe.losses, []
    if not losses:
        probe.emit_step(rec, None)
        return
    device = losses[0].device.type
    if device == "cpu":
        probe.emit_step(rec, sum(float(x.detach().item()) for x in losses) / len(losses))
    elif device == "cuda":
        mean = (
            torch.stack([x.detach().float() for x in losses]).mean() if len(losses) > 1 else losses[0].detach().float()
        )
        host = mean.to("cpu", non_blocking=True)
        done = torch.cuda.Event()
        done.record()
        probe.defer_step(rec, host, done)
    else:
        probe.emit_step(rec, None)


def _backward_hook(torch: Any, probe: Probe, first_forward: _FirstForward) -> None:
    autograd = torch.autograd
    original = autograd.backward

    tensor = torch.Tensor

    @functools.wraps(original)
    def backward(tensors: Any, *args: Any, **kwargs: Any) -> Any:
        if not probe.on:
            return original(tensors, *args, **kwargs)
        try:
            probe.on_backward_begin()
        except Exception as exc:
            probe.fail(exc)
        t0 = time.perf_counter()
        out = original(tensors, *args, **kwargs)
        if probe.on:
            try:
                # The loss kept as it is (its graph is freed by now) and detached only when it is
                # read: a detach per backward is a new tensor per step, for a record that may fold it.
                loss = tensors if isinstance(tensors, tensor) and tensors.numel() == 1 else None
                probe.on_backward(loss, time.perf_counter() - t0)
                if probe.count < DISCOVER_STEPS:
                    first_forward.arm()
            except Exception as exc:
                probe.fail(exc)
        return out

    _replace(autograd, "backward", backward)


def _collective_hooks(torch: Any, dist: Any, probe: Probe) -> None:
    c10d: Any = importlib.import_module("torch.distributed.distributed_c10d")
    depth = [0]

    def wrap(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def collective(*args: Any, **kwargs: Any) -> Any:
            outer = depth[0] == 0
            depth[0] += 1
            if outer and probe.on:
                try:
                    probe.on_collective(name)
                except Exception as exc:
                    probe.fail(exc)
            t0 = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                depth[0] -= 1
                if outer and probe.on:
                    try:
                        probe.on_collective(None, time.perf_counter() - t0)
                    except Exception as exc:
                        probe.fail(exc)

        collective.__aerie_probe__ = True  # type: ignore[attr-defined]
        return collective

    for name in COLLECTIVES:
        original = getattr(c10d, name, None)
        if original is None or getattr(original, "__aerie_probe__", False):
            continue
        wrapped = wrap(name, original)
        for module in (c10d, dist):
            if getattr(module, name, None) is original:
                _replace(module, name, wrapped)

    init = c10d.init_process_group
    failing: list[bool] = []  # an uncaught exception is ending the process (sys.excepthook ran)

    def destroy_at_exit() -> None:
        """gloo's process group destroyed while the interpreter is whole: left to finalization, its
        worker threads' pending work drops tensors after the GIL can no longer be taken, and a
        rank that trained every step aborts (`terminate called without an active exception`,
        SIGABRT: seen at a Lightning job's end, which never destroys it). Not on NCCL (its destroy
        may wait on a hung peer), not inside a collective, not when an exception ends the rank."""
        probe.exiting(failed=bool(failing))  # first: what follows is the rank's wind-down
        if failing or depth[0] > 0 or not c10d.is_initialized() or str(c10d.get_backend()) != "gloo":
            return
        c10d.destroy_process_group()

    def note_failure(hook: Callable[..., Any]) -> Callable[..., Any]:
        def excepthook(*exc_info: Any) -> Any:
            failing.append(True)
            return hook(*exc_info)

        return excepthook

    @functools.wraps(init)
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        out = init(*args, **kwargs)
        _guard(lambda: probe.claim(int(dist.get_rank())))  # the rank is known now
        if not getattr(init_process_group, "registered", False):
            init_process_group.registered = True  # type: ignore[attr-defined]
            sys.excepthook = note_failure(sys.excepthook)
            atexit.register(lambda: _guard(destroy_at_exit))  # before finalization
        return out

    for module in (c10d, dist):
        if getattr(module, "init_process_group", None) is init:
            _replace(module, "init_process_group", init_process_group)


def _sectioned(original: Callable[..., Any], staged: bool = False) -> Callable[..., Any]:
    """`original` (a save) inside a checkpoint section."""

    @functools.wraps(original)
    def save(*args: Any, **kwargs: Any) -> Any:
        probe = PROBE
        opened = bool(_guard(probe.save_begin)) if probe is not None else False
        if not opened:
            return original(*args, **kwargs)
        assert probe is not None  # opened: there is a probe
        target = args[1] if len(args) > 1 else kwargs.get("f", kwargs.get("checkpoint_id", kwargs.get("filename")))
        uri = str(target) if isinstance(target, (str, bytes)) or hasattr(target, "__fspath__") else None
        t0, ok = time.perf_counter(), False
        try:
            out = original(*args, **kwargs)
            ok = True
        finally:
            _guard(probe.save_end, time.perf_counter() - t0, ok, uri, staged and ok)
        if staged and ok and hasattr(out, "add_done_callback"):
            out.add_done_callback(lambda fut: _guard(_async_done, probe, fut, t0, uri))
        return out

    save.__aerie_probe__ = True  # type: ignore[attr-defined]
    return save


def _async_done(probe: Probe, future: Any, t0: float, uri: str | None) -> None:
    from aerie_contracts import metrics as keys
    from aerie_contracts.metrics import MetricEvent

    total = time.perf_counter() - t0
    ok = future.exception() is None
    fields: dict[str, Any] = {keys.OK: ok, keys.URI: uri, keys.SAVE_S: round(total, 4)}
    probe.event(MetricEvent.CHECKPOINT_END, **fields)


def _save_hooks(torch: Any) -> None:
    if not getattr(torch.save, "__aerie_probe__", False):
        _replace(torch, "save", _sectioned(torch.save))
        serialization: Any = importlib.import_module("torch.serialization")
        _replace(serialization, "save", torch.save)


def _dcp_hooks(dcp: Any) -> None:
    def patch() -> None:
        for name, staged in (("save", False), ("async_save", True)):
            original = getattr(dcp, name, None)
            if original is not None and not getattr(original, "__aerie_probe__", False):
                _replace(dcp, name, _sectioned(original, staged))

    _guard(patch)


def _safetensors_hooks(st: Any) -> None:
    """`safetensors.torch.save_file` (HF's model files): a save like `torch.save`."""

    def patch() -> None:
        original = getattr(st, "save_file", None)
        if original is not None and not getattr(original, "__aerie_probe__", False):
            _replace(st, "save_file", _sectioned(original))

    _guard(patch)


def _priming_hooks(state_dict: Any) -> None:
    """Steps inside DCP's optimizer-state priming are not training steps (see the docstring)."""

    def patch() -> None:
        original = getattr(state_dict, "_init_optim_state", None)
        if original is None or getattr(original, "__aerie_probe__", False):
            return

        @functools.wraps(original)
        def _init_optim_state(*args: Any, **kwargs: Any) -> Any:
            probe = PROBE
            if probe is None:
                return original(*args, **kwargs)
            probe.priming += 1
            try:
                return original(*args, **kwargs)
            finally:
                probe.priming -= 1

        _init_optim_state.__aerie_probe__ = True  # type: ignore[attr-defined]
        _replace(state_dict, "_init_optim_state", _init_optim_state)

    _guard(patch)


def _data_hook(torch: Any) -> None:
    loader = importlib.import_module("torch.utils.data.dataloader")
    cls = loader._BaseDataLoaderIter
    original = cls.__next__
    probe = PROBE

    @functools.wraps(original)
    def __next__(self: Any) -> Any:
        t0 = time.perf_counter()
        out = original(self)
        if probe is not None and probe.on:
            probe.acc["data_s"] += time.perf_counter() - t0  # `Probe.on_data`, inline: no call more
        return out

    _replace(cls, "__next__", __next__)
