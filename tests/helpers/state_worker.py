"""Shared parts of the two-rank state round trips (tests/trainer/checkpoint/test_dcp.py and
test_memory.py): a worker script run by torchrun imports the model, training and comparison
functions from here; the test runs it with `run_two_ranks` and reads each rank's JSON result."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[2]

# The trainer state a worker saves at step 3.
EXTRA = {"step": 3, "consumed_samples": 24, "tokens": 384}


def make(world, parallelism: str, seed: int):
    """A tiny model, parallelized as asked, with its optimizer and scheduler."""
    from trainer import parallel
    from trainer.models import build_model, get_preset

    torch.manual_seed(seed)
    model = parallel.parallelize(build_model(get_preset("pythia-tiny")), world, parallelism)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (s + 1))
    return model, opt, sched


def train(model, opt, sched, n: int) -> None:
    for _ in range(n):
        x = torch.randint(0, 512, (2, 17))
        F.cross_entropy(model(x[:, :-1]).flatten(0, 1), x[:, 1:].flatten()).backward()
        opt.step()
        sched.step()
        opt.zero_grad()


def full(model, opt):
    """The full (unsharded) model and optimizer state, cloned: (model, optimizer state, groups)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    msd, osd = get_state_dict(model, opt, options=StateDictOptions(full_state_dict=True))

    def clone(v):
        return v.detach().clone() if isinstance(v, torch.Tensor) else v

    return (
        {k: clone(v) for k, v in msd.items()},
        {k: {n: clone(t) for n, t in s.items()} for k, s in osd["state"].items()},
        osd["param_groups"],
    )


def same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def seed_rank(rank: int) -> None:
    """Different RNG streams per rank, so a restore that mixes ranks up shows."""
    torch.manual_seed(100 + rank)
    random.seed(rank)
    np.random.seed(rank)


def draws() -> tuple:
    """The next draws of every RNG a restore must bring back."""
    return (torch.rand(3), random.random(), float(np.random.rand()))


def restored(model, opt, sched, got_extra: dict, expected: tuple, expected_sched: dict, before: tuple) -> dict:
    """Which parts a restore brought back. Call it right after the load: it draws from the RNGs."""
    after = draws()
    return {
        "model": same(full(model, opt)[0], expected[0]),
        "optim": same(full(model, opt)[1:], expected[1:]),
        "scheduler": sched.state_dict() == expected_sched,
        "rng": same(before, after),
        "extra": got_extra == EXTRA,
    }


def finish(out: str, rank: int, result: dict) -> None:
    """Write this rank's result and leave without interpreter finalization."""
    import torch.distributed as dist

    Path(out, f"rank-{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()
    # Skip interpreter finalization: gloo's C++ threads can still hold tensors whose release then
    # needs a GIL that is being torn down, and the rank aborts ("terminate called without an active
    # exception", pytorch/pytorch#179291) after all of its work is done.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run_two_ranks(tmp_path: Path, worker: str, *args: str) -> list[dict]:
    """Run the worker script on 2 ranks (argv: args, then the output dir); each rank's result."""
    script = tmp_path / "worker.py"
    script.write_text(worker)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", str(script)]
        + [*args, str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr[-6000:]
    return [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in (0, 1)]
