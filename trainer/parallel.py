"""Process group, device and model wrapping: DDP or FSDP2, activation checkpointing, compile.

Ranks come from torchrun's environment (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`, ...).
Started without torchrun, the process is a world of one on a free loopback port, so the training
loop has a single code path. gloo on CPU, nccl on GPU; bf16 autocast on GPU by default (CPU stays
fp32 unless the config asks for `precision: bf16`; fp32 is what makes resume parity bitwise there).
"""

from __future__ import annotations

import contextlib
import inspect
import os
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn

# How long a collective may block before PyTorch gives up: the blind spot Aerie's detectors beat.
# The trainer logs it at start ("collective timeout N s"), where bench/detect.py reads it.
COLLECTIVE_TIMEOUT_S = 1800.0


@dataclass(frozen=True)
class World:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    device: torch.device
    collective_timeout_s: float = COLLECTIVE_TIMEOUT_S

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def num_nodes(self) -> int:
        return max(1, self.world_size // self.local_world_size)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_distributed(timeout_s: float = COLLECTIVE_TIMEOUT_S) -> World:
    """Join (or, alone, create) the default process group and pick this rank's device."""
    if "RANK" not in os.environ:
        os.environ.update(
            RANK="0",
            WORLD_SIZE="1",
            LOCAL_RANK="0",
            LOCAL_WORLD_SIZE="1",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(_free_port()),
        )
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device = torch.device("cpu")
        backend = "gloo"
    if not dist.is_initialized():
        dist.init_process_group(
            backend, timeout=timedelta(seconds=timeout_s), device_id=device if device.type == "cuda" else None
        )
    return World(rank, world_size, local_rank, local_world_size, device, timeout_s)


def use_deterministic_kernels() -> None:
    """Deterministic kernels for this process (`TrainConfig.deterministic`); before any CUDA work:
    cuBLAS reads its workspace setting when its first handle is made."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)


def destroy_distributed() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def autocast(world: World, precision: str = "auto") -> contextlib.AbstractContextManager:
    """bf16 autocast for `precision` "bf16", and for "auto" on GPU; nothing otherwise (see
    `TrainConfig.precision`)."""
    if precision == "bf16" or (precision == "auto" and world.device.type == "cuda"):
        return torch.autocast(world.device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def apply_activation_checkpointing(model: nn.Module) -> None:
    """Recompute each block's activations in backward instead of keeping them."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    for i, block in enumerate(model.layers):
        model.layers[i] = checkpoint_wrapper(block, preserve_rng_state=True)


def apply_compile(model: nn.Module) -> None:
    """Compile block by block (repeated blocks share one graph, and FSDP2 hooks stay outside)."""
    for i, block in enumerate(model.layers):
        model.layers[i] = torch.compile(block)


def parallelize(
    model: nn.Module, world: World, parallelism: str, activation_checkpointing: bool = False, compile: bool = False
) -> nn.Module:
    """Wrap `model` (already on `world.device`, identically initialised on every rank)."""
    if activation_checkpointing:
        apply_activation_checkpointing(model)
    if compile:
        apply_compile(model)
    if parallelism == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh(world.device.type, (world.world_size,))
        for block in model.layers:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model
    if parallelism == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        ids = [world.device.index] if world.device.type == "cuda" else None
        # No buffer broadcast: the only buffers (RoPE tables) are computed identically on every
        # rank and never change, and the broadcast would be a blocking collective at the start of
        # every micro-batch's forward (a wait that trainer.step_clock could not attribute).
        # (`forward_sync_buffers` since PyTorch 2.13; a container's older PyTorch calls it
        # `broadcast_buffers`: a bring-your-own image need not match the pinned version.)
        no_sync = "forward_sync_buffers" in inspect.signature(DistributedDataParallel.__init__).parameters
        buffers = {"forward_sync_buffers": False} if no_sync else {"broadcast_buffers": False}
        return DistributedDataParallel(model, device_ids=ids, **buffers)
    raise ValueError(f"unknown parallelism {parallelism!r}")


@contextlib.contextmanager
def gradient_sync(model: nn.Module, enabled: bool) -> Iterator[None]:
    """Skip the gradient all-reduce / reduce-scatter on all but the last micro-batch of a step."""
    if hasattr(model, "no_sync"):  # DDP
        with contextlib.nullcontext() if enabled else model.no_sync():
            yield
        return
    if hasattr(model, "set_requires_gradient_sync"):  # FSDP2
        model.set_requires_gradient_sync(enabled)
    yield


def settle_gradient_buckets(model: torch.nn.Module, sample: torch.Tensor, loss_fn) -> None:
    """Give a resumed DDP run the gradient buckets an uninterrupted one trains with.

    DDP lays out its first iteration's buckets in reverse parameter order, then rebuilds them once
    in the order gradients became ready. With more than two ranks, where a value sits in a bucket
    decides the order the ring all-reduce adds the ranks' values in, so a run's first step after a
    restart (old layout) would round differently from the same step of a run that never stopped
    (rebuilt layout), and the runs drift apart. One throw-away forward/backward on `sample` makes
    DDP rebuild before the first real step; the gradients are dropped and the RNG left as it was,
    so the model, optimizer and data position are untouched. A no-op for FSDP2 and one process."""
    from torch.nn.parallel import DistributedDataParallel

    if not isinstance(model, DistributedDataParallel) or dist.get_world_size() <= 2:
        return  # two ranks add in one order whatever the layout
    devices = [torch.cuda.current_device()] if sample.is_cuda else []
    with torch.random.fork_rng(devices=devices):
        loss_fn(model, sample).backward()
    model.zero_grad(set_to_none=True)
