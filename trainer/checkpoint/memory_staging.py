"""What the step loop waits for while a memory snapshot is taken, kept small.

`Staging` copies the state's tensors into host buffers allocated once and reused (pinned, with
one device sync, on a GPU), so the background writer serializes a copy training cannot change.
`StateCache` works out the state's structure (`get_state_dict`'s walk of the model and the
optimizer, which costs more than copying a small model's tensors) once, and rebuilds the dicts
from the live tensors while they are the same tensors (checked every time, by identity and
storage; otherwise it is worked out again). Both copies are exact: a resume is bitwise the same.
"""

from __future__ import annotations

from typing import Any

import torch

from trainer.checkpoint import dcp
from trainer.checkpoint.memory_file import local_shards


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
        staged = self._walk(local_shards(state))
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
