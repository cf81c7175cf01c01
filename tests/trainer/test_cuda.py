"""The trainer on an NVIDIA GPU (skipped where there is none: CI has none; run on a GPU machine).

A world of one on `cuda:0`, precision `auto` (bf16 autocast on a GPU), the stdlib corpus:

1. 40 steps with durable checkpoints (file://) every 20 and memory snapshots every 10 into a
   private shared-memory area, as an attempt of a job would write them;
2. a second run resumed from the durable step 20, and a third from the memory snapshot of step 30
   (`mem://`, read back from shared memory: the GPU state went through host memory and back);
3. each resumed run's steps match the uninterrupted run's: bit for bit with the config's
   `deterministic: true`, the loss to 1e-3 without it (the embedding's backward and some
   reductions may add in another order from one run to the next on a GPU).

Run on an NVIDIA H200 (PyTorch 2.11.0+cu130, 2026-11-27): both cases passed, every resumed step's
loss equal to the uninterrupted run's bit for bit (deterministic or not, at this size), 86 s.
Again on an NVIDIA H100 80GB (PyTorch 2.11.0+cu130, 2026-11-28, with the snapshots' StateCache):
both passed, 83 s. The same session ran pre-flight's probe (agent/preflight/probe.py) there as two
nodes on loopback: the CUDA burn measured 217 TFLOP/s bf16 on each (both on the one GPU at once)
and the TCP all-reduce of 8 MiB summed right.
There: `pytest --noconftest -o addopts= tests/trainer/test_cuda.py` (the root conftest needs the
control plane's packages).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

from aerie_contracts import env
from aerie_contracts.checkpoints import attempt_dir, memory_uri, step_dir
from tests.helpers.tiny_trainer import REPO, trainer_env, write_tiny_config

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU (CUDA)")

JOB = "gpu-job"


def _run(workdir: Path, config: Path, name: str, extra: dict[str, str]) -> dict[int, dict]:
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    run_env = trainer_env(workdir / name, PYTHONPATH=path, **{env.JOB: JOB, **extra})
    proc = subprocess.run(
        [sys.executable, "-m", "trainer.train", "--config", str(config)],
        cwd=workdir,
        env=run_env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-6000:])
    lines = (workdir / name / "metrics" / "rank-00000.jsonl").read_text().splitlines()
    return {r["step"]: r for r in map(json.loads, lines) if r.get("event") is None}


@pytest.fixture
def shm_area():
    root = Path(tempfile.mkdtemp(prefix="aerie-gpu-", dir="/dev/shm" if Path("/dev/shm").is_dir() else None))
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.mark.parametrize("deterministic", [True, False], ids=["deterministic", "default"])
def test_resume_from_s3_tier_and_memory_tier_on_a_gpu(tmp_path, shm_area, deterministic):
    config = write_tiny_config(
        tmp_path / "config.yaml",
        tmp_path / "cache",
        max_bytes=1_000_000,
        steps=40,
        warmup=4,
        deterministic=deterministic,
    )
    base = f"file://{tmp_path}/ckpt"
    common = {
        env.MEMORY_CHECKPOINT_DIR: str(shm_area),
    }
    full = _run(
        tmp_path,
        config,
        "full",
        {
            **common,
            env.ATTEMPT_NUMBER: "1",
            env.CHECKPOINT_URI: base,
            env.CHECKPOINT_EVERY: "20",
            env.MEMORY_CHECKPOINT_EVERY: "10",
        },
    )
    assert sorted(full) == list(range(1, 41))
    assert full[40]["loss"] < full[1]["loss"]
    resumed = {
        20: _run(
            tmp_path,
            config,
            "from-s3-tier",
            {**common, env.ATTEMPT_NUMBER: "2", env.RESUME_FROM: f"{base}/{step_dir(20)}/{attempt_dir(1)}"},
        ),
        30: _run(
            tmp_path,
            config,
            "from-memory",
            {**common, env.ATTEMPT_NUMBER: "2", env.RESUME_FROM: memory_uri(JOB, 30, 1)},
        ),
    }
    for start, run in resumed.items():
        assert sorted(run) == list(range(start + 1, 41)), (start, sorted(run))
        for step in run:
            a, b = full[step]["loss"], run[step]["loss"]
            if deterministic:
                assert a == b, (start, step, a, b)
            else:
                assert a == pytest.approx(b, rel=1e-3), (start, step, a, b)
        worst = max(abs(full[s]["loss"] - run[s]["loss"]) for s in run)
        print(f"resumed from step {start}: largest loss difference {worst:.3g} (deterministic={deterministic})")
