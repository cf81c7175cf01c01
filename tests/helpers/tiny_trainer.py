"""A few real steps of the trainer on pythia-tiny, outside any job: its config, environment and run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]


def write_tiny_config(path: Path, cache: Path, max_bytes: int = 300_000, **overrides) -> Path:
    """A pythia-tiny config on the stdlib corpus at `path`; `overrides` replace top-level keys."""
    cfg = {
        "model": {"preset": "pythia-tiny"},
        "data": {"corpus": "stdlib", "max_bytes": max_bytes, "cache_dir": str(cache)},
        "seq_len": 32,
        "micro_batch_size": 4,
        "steps": 4,
        "warmup": 1,
        "lr": 3e-3,
        "min_lr": 3e-4,
    }
    cfg.update(overrides)
    path.write_text(yaml.safe_dump(cfg))
    return path


def trainer_env(root: Path, **extra: str) -> dict[str, str]:
    """This environment for one trainer process: metrics and output under `root`, one CPU thread, no
    resume and none of a job's settings inherited; `extra` adds or replaces variables."""
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "AERIE_METRICS_PATH": str(root / "metrics"),
        "SM_OUTPUT_DATA_DIR": str(root / "output"),
        "AERIE_RESUME_FROM": "",
    }
    for name in ("SM_HPS", "AERIE_ML_ROOT"):
        env.pop(name, None)
    env.update(extra)
    return env


def train(config: Path, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """`python -m trainer.train --config CONFIG` from the repository, its output captured."""
    return subprocess.run(
        [sys.executable, "-m", "trainer.train", "--config", str(config)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
