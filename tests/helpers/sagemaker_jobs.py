"""Jobs on the SageMaker stand-in (tests/helpers/sagemaker_standin.py): a control plane whose
`sagemaker` backend talks to it, the spec of a job in the trainer image, and the two together."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from devtools.harness.control_plane import REPO, ControlPlane, free_port_block, write_spec
from devtools.harness.jobs import FAST_HEALTH

IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/aerie/trainer:0.1.0"
# Ports kept free for a job's rendezvous: its own and its in-place attempts' (each one up).
IN_PLACE_PORTS = 8
TINY = {"entrypoint": ["python", "-m", "trainer.train"], "args": ["--config", "examples/configs/pythia-tiny.yaml"]}


@contextmanager
def sagemaker_plane(home: Path, standin: Any) -> Iterator[ControlPlane]:
    """A control plane in `home` (made here) whose unmodified boto3 reaches the stand-in; stopped after."""
    home.mkdir()
    aws = {"AWS_ENDPOINT_URL_SAGEMAKER": standin.url, "AERIE_SAGEMAKER_ROLE_ARN": "arn:aws:iam::1:role/aerie"}
    cp = ControlPlane(home, extra_env=aws).start()
    try:
        yield cp
    finally:
        cp.stop()


def sagemaker_spec(
    path: Path, name: str, bucket: str, *, instances: int = 2, spare_nodes: int = 0, steps: int | None = None, **fields
) -> Path:
    """A `sagemaker` job in the trainer image, one rank per ml.m5.xlarge instance, output to
    `bucket`, the image's code directory this checkout and a rendezvous port of the test's own
    (below the ephemeral range, its in-place successors' free too); the tiny trainer for `steps`
    unless `fields` name the entrypoint. `fields`: more spec fields (they win)."""
    resources = {"instance_type": "ml.m5.xlarge", "instance_count": instances, "procs_per_node": 1}
    spec: dict[str, Any] = {
        "name": name,
        "image": IMAGE,
        **TINY,
        "output": {"s3_uri": f"s3://{bucket}/output"},
        "resources": resources | ({"spare_nodes": spare_nodes} if spare_nodes else {}),
        "health": FAST_HEALTH,
        "backend": "sagemaker",
        "backend_options": {"container_workdir": str(REPO), "master_port": free_port_block(IN_PLACE_PORTS)},
    }
    if steps is not None:
        spec["hyperparameters"] = {"steps": str(steps), "eval_every": "1000000", "seq_len": "64"}
    return write_spec(path, **{**spec, **fields})


@contextmanager
def sagemaker_job(
    tmp_path: Path, standin: Any, name: str, bucket: str, *, checkpoint: dict[str, Any] | None = None, **fields
) -> Iterator[ControlPlane]:
    """A `sagemaker_plane` in `tmp_path` with the `sagemaker_spec` job `name` submitted, its
    checkpoints under s3://`bucket`/checkpoints (`checkpoint`: the other checkpoint fields)."""
    with sagemaker_plane(tmp_path / "home", standin) as cp:
        checkpoint = {"s3_uri": f"s3://{bucket}/checkpoints", **(checkpoint or {})}
        spec = sagemaker_spec(tmp_path / f"{name}.json", name, bucket, checkpoint=checkpoint, **fields)
        cp.cli("submit", str(spec), check=True)
        yield cp
