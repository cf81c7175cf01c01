"""Specs for end-to-end runs of the real trainer on the local backend (tests, chaos, benches)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from aerie_contracts import byo
from aerie_contracts import env as aerie_env

REPO = Path(__file__).resolve().parents[2]

# Tight enough that a hang is caught in seconds here; clean runs of the tiny model never trip them.
FAST_HEALTH = {
    "startup_grace_s": 20,
    "hang_floor_s": 12,
    "hang_factor": 5,
    "heartbeat_s": 2,
    "first_step_timeout_s": 240,
}

# The rank faults the chaos and recovery runs inject, one per attempt in this order: (kind, rank).
RANK_FAULTS = (("sigkill", 3), ("sigstop", 1), ("busy_hang", 2))


def rank_faults(*steps: int) -> list[dict[str, Any]]:
    """`RANK_FAULTS` at these steps, the n-th in attempt n (AERIE_FAULTS entries)."""
    return [
        {"kind": kind, "step": step, "rank": rank, "attempt": n}
        for n, ((kind, rank), step) in enumerate(zip(RANK_FAULTS, steps, strict=True), 1)
    ]


def trainer_spec(
    path: Path,
    name: str,
    *,
    steps: int = 60,
    nodes: int = 2,
    procs: int = 2,
    faults: list[dict[str, Any]] | None = None,
    checkpoint_uri: str | None = None,
    every_steps: int = 20,
    memory_every_steps: int | str | None = None,
    max_restarts: int = 0,
    in_place_restarts: int | None = None,
    spare_nodes: int = 0,
    health: dict | None = None,
    extra_hps: dict[str, str] | None = None,
    env: dict[str, str] | None = None,
    backend_options: dict[str, Any] | None = None,
) -> Path:
    """A job spec that trains the tiny Pythia-style model (examples/configs/pythia-tiny.yaml)."""
    spec: dict[str, Any] = {
        "name": name,
        "entrypoint": ["python", "-m", "trainer.train"],
        "args": ["--config", "examples/configs/pythia-tiny.yaml"],
        "hyperparameters": {"steps": str(steps), "eval_every": "1000000", "seq_len": "64", **(extra_hps or {})},
        "resources": {"instance_count": nodes, "procs_per_node": procs}
        | ({"spare_nodes": spare_nodes} if spare_nodes else {}),
        "retry": {"max_restarts": max_restarts}
        | ({} if in_place_restarts is None else {"in_place_restarts": in_place_restarts}),
        "health": {**FAST_HEALTH, **(health or {})},
        "backend_options": {"workdir": str(REPO), **(backend_options or {})},
        "env": dict(env or {}),
    }
    if faults:
        spec["env"][aerie_env.FAULTS] = json.dumps(faults)
    if checkpoint_uri:
        spec["checkpoint"] = {"s3_uri": checkpoint_uri, "every_steps": every_steps, "keep_last": 3}
    if memory_every_steps is not None:
        spec.setdefault("checkpoint", {})["memory_every_steps"] = memory_every_steps
    path.write_text(json.dumps(spec))
    return path


def s3_spec(
    folder: Path, name: str, *, steps: int, s3_every: int, memory_every: int | None = None, **options: Any
) -> Path:
    """`trainer_spec` written to <folder>/<name>.json, checkpointing to the loopback S3 server's
    bucket (s3://aerie/<name>) every `s3_every` steps and, with `memory_every`, to memory."""
    return trainer_spec(
        folder / f"{name}.json",
        name,
        steps=steps,
        checkpoint_uri=f"s3://aerie/{name}",
        every_steps=s3_every,
        memory_every_steps=memory_every,
        **options,
    )


def step_records(attempt_dir: Path, rank: int | None = 0) -> list[dict]:
    """The training-step lines (no events) of one attempt's metrics, for `rank` or every rank (None)."""
    return _steps_in(attempt_dir, "metrics", rank)


def event_records(attempt_dir: Path, event: str, nodes: str = "algo-*") -> list[dict]:
    """`event`'s lines in the live metrics streams of every rank under an attempt directory
    (`nodes`: its node folders, e.g. `node*` on Slurm)."""
    return _steps_in(attempt_dir, "metrics", None, event, nodes)


def _steps_in(
    root: Path, metrics: str, rank: int | None, event: str | None = None, nodes: str = "algo-*", probe: bool = False
) -> list[dict]:
    """The training-step lines (or, with `event`, that event's lines) of the `metrics` streams
    under `root`'s `nodes` (a torn line skipped): the trainer's own and a log parser's, not the
    in-process probe's (it writes the same streams; its loss is the rank's own, its saves the
    trainer's saves seen again from inside `torch.save`/DCP), unless `probe`."""
    pattern = "rank-*.jsonl" if rank is None else f"rank-{rank:05d}.jsonl"
    recs = []
    for f in root.glob(f"{nodes}/output/{metrics}/{pattern}"):
        for line in f.read_text().splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if rec.get(byo.SOURCE_KEY) == byo.SOURCE_PROBE and not probe:
                continue
            if rec.get("event") == event and (event is not None or rec.get("step") is not None):
                recs.append(rec)
    return recs


def served_by(root: Path) -> list[int]:
    """The attempts whose ranks ran under a launched attempt's directory, in order: its own and
    the in-place attempts that followed on the same agents (the backend's `handle-<n>.json`)."""
    own = int(root.name.split("-")[1])
    return sorted({own} | {int(h.stem.split("-")[1]) for h in root.glob("handle-*.json")})


def attempt_step_records(
    job_dir: Path, number: int, rank: int | None = 0, event: str | None = None, probe: bool = False
) -> list[dict]:
    """`step_records` (or `event`'s lines) of attempt `number`, relaunched or restarted in place:
    an in-place attempt runs under the directory of the attempt that launched its agents, where
    each agent set the stream of the group before aside as `output/metrics.attempt-<n>`. With
    `probe`, the in-process probe's records too."""
    roots = [d for d in job_dir.glob("attempt-*") if number in served_by(d)]
    if not roots:
        return []
    served = served_by(roots[0])
    metrics = "metrics" if number == served[-1] else f"metrics.attempt-{number}"
    return _steps_in(roots[0], metrics, rank, event, probe=probe)


def rank_losses(jobs_dir: Path, job_id: str, rank: int = 0) -> dict[int, dict[int, float]]:
    """{attempt number: {step: loss}} from the metrics stream of `rank` in every attempt."""
    job_dir = jobs_dir / job_id
    numbers = sorted({n for d in job_dir.glob("attempt-*") for n in served_by(d)})
    return {n: {int(r["step"]): r["loss"] for r in attempt_step_records(job_dir, n, rank)} for n in numbers}
