"""Jobs of `tests/e2e/contract_check.py` (it checks the node contract, then steps), for the backends'
whole-job tests."""

from __future__ import annotations

from pathlib import Path

from devtools.harness.control_plane import write_spec

CONTRACT = ["python", "tests/e2e/contract_check.py"]


def contract_spec(tmp_path: Path, name: str, args: list[str], nodes: int = 2, procs: int = 2, **extra) -> str:
    """A job spec file running the contract check on `nodes` x `procs` ranks; `extra`: more spec fields."""
    return str(
        write_spec(
            tmp_path / f"{name}.json",
            name=name,
            entrypoint=CONTRACT,
            args=args,
            hyperparameters={"lr": "3e-4", "layers": "2"},
            resources={"instance_count": nodes, "procs_per_node": procs},
            **extra,
        )
    )
