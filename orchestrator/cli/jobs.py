"""The commands that act on jobs: submit one, list them, do a fault to one (chaos), stop one."""

from __future__ import annotations

import json
import os
from pathlib import Path

import typer
from pydantic import ValidationError
from rich.table import Table

from aerie_contracts import env
from aerie_contracts.states import JobState
from orchestrator.cli.api import _call, _client, _die
from orchestrator.cli.logs import _follow
from orchestrator.cli.output import _age, _state, console
from orchestrator.sagemaker_mapping import spec_from_document
from orchestrator.spec import SpecError, format_validation_error, load_document


def submit(
    spec_path: Path = typer.Argument(
        ..., metavar="SPEC", help="Job spec (YAML/JSON) or a CreateTrainingJob request (JSON)."
    ),
    follow: bool = typer.Option(
        False, "--follow", "-f", help="Stream logs until the job ends; exit 0 only if it completed."
    ),
    name: str | None = typer.Option(None, help="Override the spec's name."),
    backend: str | None = typer.Option(None, help="Override the spec's backend: local, slurm or sagemaker."),
    fault: list[str] = typer.Option(
        [],
        "--fault",
        metavar="KIND@STEP[:rank=R][:attempt=N]",
        help="Inject a fault to rehearse recovery (repeatable): nan, busy_hang, "
        "sigstop, sigkill, exit, slow, spike. E.g. --fault busy_hang@30:rank=1",
    ),
) -> None:
    """Submit a job. The spec is checked here first, so every bad field is named at once."""
    try:
        data = load_document(spec_path)
        if name:
            data["name" if "AlgorithmSpecification" not in data else "TrainingJobName"] = name
        spec = spec_from_document(data)
    except SpecError as exc:
        _die(str(exc), 2)
    except ValidationError as exc:
        _die(f"{spec_path} is not a valid job spec:\n{format_validation_error(exc)}", 2)
    if backend:
        spec = spec.model_copy(update={"backend": backend})
    if fault:
        from trainer.faults import parse_cli

        try:
            faults = [parse_cli(f) for f in fault]
        except ValueError as exc:
            _die(str(exc), 2)
        spec = spec.model_copy(update={"env": {**spec.env, env.FAULTS: json.dumps(faults)}})
    if spec.backend in ("local", "slurm") and "workdir" not in spec.backend_options:
        # Like SkyPilot's workdir: local and Slurm nodes (shared filesystem) run the code from where you submitted.
        spec = spec.model_copy(update={"backend_options": {**spec.backend_options, "workdir": os.getcwd()}})
    client = _client()
    job = _call(client.submit, spec.model_dump(mode="json"))
    console.print(
        f"submitted [bold]{job['id']}[/bold] ({spec.resources.instance_count} node(s) x "
        f"{spec.resources.procs_per_node} process(es), backend {spec.backend})"
    )
    if follow:
        state = _follow(client, job["id"], condense=True)
        raise typer.Exit(0 if state == JobState.COMPLETED else 1)


def list_jobs(state: str | None = typer.Option(None, help="Only jobs in this state.")) -> None:
    """List jobs, newest first."""
    jobs = _call(_client().jobs, state)
    table = Table("ID", "NAME", "STATE", "BACKEND", "ATTEMPTS", "AGE", "REASON")
    for j in jobs:
        reason = (j.get("reason") or {}).get("kind", "")
        table.add_row(
            j["id"], j["name"], _state(j["state"]), j["backend"], str(j["attempts"]), _age(j["created_at"]), reason
        )
    console.print(table)


def chaos(
    job: str = typer.Argument(..., help="Job id or name."),
    node: int = typer.Option(..., "--node", help="The node's rank in the running attempt (0 = first host)."),
    rank: int | None = typer.Option(
        None, "--rank", help="The global rank on that node (sigstop, sigkill and freeze are done to one rank)."
    ),
    fault: str = typer.Option(
        ...,
        "--fault",
        help="sigstop | sigkill | freeze (one rank); slow-nic (the node's NIC, nodes in network namespaces); "
        "node-loss (the whole node dies at once and its memory is gone; local backend)",
    ),
) -> None:
    """Do a fault to one real rank, or to a whole node, of a running job, from the outside (audited as an event)."""
    r = _call(_client().chaos, job, node, rank, fault)
    target = f"rank {r['rank']} on {r['host']}" if r.get("rank") is not None else r["host"]
    console.print(f"{fault} requested for {target} ({r['attempt_id']}, request {r['id']})")


def stop(job: str = typer.Argument(..., help="Job id or name.")) -> None:
    """Stop a job: its nodes get SIGTERM, then SIGKILL after a grace period."""
    j = _call(_client().stop, job)
    console.print(f"stopping {j['id']} (state {j['state']})")
