"""`examples/pythia-tiny.yaml` on `local` and on `slurm`, with only `backend:` changed: same losses.

Both runs go through one real `aerie up`, train the tiny model on 2 nodes x 2 processes (DDP on
CPU) with checkpoints to the loopback S3 server, and must log the same loss at every step. The
test shortens the run through hyperparameters, identically for both backends.
"""

from __future__ import annotations

import json

import pytest
import yaml

from aerie_contracts import byo
from devtools.harness.control_plane import REPO, ControlPlane

STEPS = 6

# Beside the unit tests (`make test`'s first phase): two fault-free runs on the example's own
# thresholds (a 30 s hang floor), nothing as tight as the serial phase's.
pytestmark = [pytest.mark.slow, pytest.mark.side_by_side]


@pytest.fixture
def cp(tmp_path, slurm_cluster, s3_env):
    plane = ControlPlane(tmp_path / "home", extra_env={**slurm_cluster, **s3_env, "OMP_NUM_THREADS": "1"})
    plane.home.mkdir()
    plane.start()
    yield plane
    plane.stop()
    plane.cleanup_nodes()


def _losses(cp: ControlPlane, job: dict, host: str) -> dict[int, float]:
    path = cp.home / "jobs" / job["id"] / "attempt-1" / host / "output" / "metrics" / "rank-00000.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()]
    # The trainer's own records (the in-process probe writes the same stream, with rank 0's own loss).
    return {
        r["step"]: r["loss"] for r in records if r.get("event") is None and r.get(byo.SOURCE_KEY) != byo.SOURCE_PROBE
    }


def test_pythia_tiny_gives_the_same_losses_on_local_and_slurm(cp, tmp_path, s3_bucket):
    spec = yaml.safe_load((REPO / "examples" / "pythia-tiny.yaml").read_text())
    spec["hyperparameters"] = {
        **spec.get("hyperparameters", {}),
        "steps": str(STEPS),
        "eval_every": "1000",
        "data.max_bytes": "1000000",
        "data.cache_dir": str(tmp_path / "data-cache"),
    }
    spec["checkpoint"]["s3_uri"] = f"s3://{s3_bucket}/checkpoints"
    spec["checkpoint"]["every_steps"] = 3
    losses = {}
    for backend, host in (("local", "algo-1"), ("slurm", "node1")):
        path = tmp_path / f"pythia-{backend}.yaml"
        path.write_text(yaml.safe_dump({**spec, "name": f"pythia-tiny-{backend}", "backend": backend}))
        r = cp.cli("submit", str(path), "--follow", timeout=600)
        job = cp.job(f"pythia-tiny-{backend}")
        assert r.returncode == 0 and job["state"] == "Completed", (r.stdout[-4000:], r.stderr[-2000:], job)
        losses[backend] = _losses(cp, job, host)
    assert sorted(losses["local"]) == list(range(1, STEPS + 1))
    assert losses["slurm"] == losses["local"]
