"""A control plane on the local Slurm cluster for whole-job tests, cleaned up after them."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from orchestrator.harness.control_plane import ControlPlane


@contextmanager
def slurm_control_plane(home: Path, env: dict[str, str], s3: bool = False) -> Iterator[ControlPlane]:
    """A started control plane (`env`: the Slurm cluster's and more; `s3`: with the loopback S3
    server); afterwards its jobs' Slurm allocations are cancelled, so none outlives the test."""
    plane = ControlPlane(home, extra_env=env, s3=s3)
    plane.home.mkdir()
    plane.start()
    try:
        yield plane
    finally:
        plane.stop()
        for handle in (plane.home / "jobs").glob("*/attempt-*/handle.json"):
            subprocess.run(["scancel", str(json.loads(handle.read_text())["slurm_job_id"])], capture_output=True)
        plane.cleanup_nodes()
