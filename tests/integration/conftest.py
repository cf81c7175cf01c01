"""Integration fixtures: the real one-host Slurm cluster of `infra/local/slurm/up.sh`.

The cluster script is idempotent, so every session runs it (`make test` thereby starts the
cluster). If the cluster cannot start the Slurm tests fail with the script's reason: they never
skip, since a skipped backend test reads as a passing one.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
UP = REPO / "infra" / "local" / "slurm" / "up.sh"


@pytest.fixture(scope="session")
def slurm_cluster() -> dict[str, str]:
    """Start (or verify) the two-node cluster; the environment that points Slurm's tools at it."""
    if os.geteuid() != 0:
        pytest.fail("the Slurm cluster needs root (slurmd, munged); CI runs as root")
    try:
        r = subprocess.run(["bash", str(UP)], capture_output=True, text=True, timeout=900)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{UP} did not finish in 15 min: {exc.stderr!s:.3000}")
    if r.returncode != 0:
        pytest.fail(f"{UP} could not start the Slurm cluster (exit {r.returncode}):\n{r.stderr[-3000:]}")
    exports = [line for line in r.stdout.splitlines() if line.startswith("export SLURM_CONF=")]
    if not exports:
        pytest.fail(f"{UP} printed no SLURM_CONF:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    env = {"SLURM_CONF": exports[-1].split("=", 1)[1]}
    os.environ.update(env)  # in-process backends and the control plane's subprocesses use it
    return env
