"""A control plane on the local Slurm cluster for whole-job tests, cleaned up after them, and the
stepper's job they run on it."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from aerie_contracts import env as aerie_env
from devtools.harness.control_plane import ControlPlane, write_spec
from devtools.harness.wait import wait_for


@contextmanager
def slurm_control_plane(
    home: Path, env: dict[str, str], s3: bool = False, idle_first: bool = False
) -> Iterator[ControlPlane]:
    """A started control plane (`env`: the Slurm cluster's and more; `s3`: with the loopback S3
    server); afterwards its jobs' Slurm allocations are cancelled, so none outlives the test.
    `idle_first`: only once every node is idle (a serial test that names the nodes Slurm picks;
    beside other Slurm tests, in `make test`'s first phase, that wait could outlast them)."""
    if idle_first:
        await_idle_nodes()
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


def await_idle_nodes(timeout_s: float = 60) -> None:
    """Wait until every node of the cluster is idle. A test's allocation would otherwise go wherever
    the previous test's (still completing) left room: with three nodes, node2 and node3 once, where
    the tests expect Slurm's own first choice, node1 and node2."""

    def states() -> str:
        return subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], capture_output=True, text=True).stdout.strip()

    try:
        wait_for(
            what="every Slurm node idle",
            check=lambda: (lines := states().splitlines()) and all(line.split()[-1] == "idle" for line in lines),
            timeout_s=timeout_s,
            every_s=0.3,
        )
    except AssertionError as exc:
        raise AssertionError(f"{exc} (sinfo: {states()!r})") from None


def stepper_spec(
    folder: Path,
    name: str,
    *,
    steps: int,
    step_s: float,
    faults: list[dict[str, Any]],
    health: dict[str, Any],
    nodes: int = 1,
    spare_nodes: int = 0,
) -> Path:
    """<folder>/<name>.json: a `slurm` job of the stepper (tests/helpers/stepper.py), one rank on
    each of `nodes` nodes (and `spare_nodes` spares), `steps` steps `step_s` apart, the AERIE_FAULTS
    `faults` and up to two restarts."""
    resources = {"instance_count": nodes, "procs_per_node": 1} | ({"spare_nodes": spare_nodes} if spare_nodes else {})
    return write_spec(
        folder / f"{name}.json",
        name=name,
        entrypoint=["python", "tests/helpers/stepper.py"],
        args=["--steps", str(steps), "--step-s", str(step_s)],
        backend="slurm",
        resources=resources,
        retry={"max_restarts": 2},
        health=health,
        env={aerie_env.FAULTS: json.dumps(faults)},
    )
