"""The batch script and `launch.json` of a Slurm attempt, and the options they are rendered from.

The script holds only `#SBATCH` lines whose values are checked against a strict pattern, and a
fixed `srun` line; every user value travels in `launch.json`, read on each node by `agent.slurm`.
Kept apart from the backend so the validation of every value that reaches a batch script stays
next to the script it guards.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.backends.base import LaunchRequest
from orchestrator.backends.nodeenv import attempt_env, channels, in_place_env, in_place_on

# A value that may appear on an #SBATCH line: no spaces, quotes, newlines or shell syntax.
SAFE_VALUE = re.compile(r"^[A-Za-z0-9_.,:\[\]=/@+%-]{1,256}$")
# Minutes the default `--time` adds to max_runtime_s (see `SlurmOptions.resolve`).
SLURM_TIME_BACKSTOP_MIN = 30


@dataclass(frozen=True)
class SlurmOptions:
    """What the batch script asks Slurm for, from `backend_options.slurm` over control-plane defaults."""

    partition: str | None = None
    account: str | None = None
    time: str | None = None
    gpus_per_node: int = 0
    cpus_per_task: int | None = None
    network_interface: str | None = None
    master_port: int | None = None

    @classmethod
    def resolve(cls, spec: Any, defaults: SlurmOptions) -> SlurmOptions:
        raw = dict((spec.backend_options or {}).get("slurm") or {})
        known = set(cls.__dataclass_fields__)
        unknown = set(raw) - known
        if unknown:
            raise ValueError(f"unknown backend_options.slurm keys {sorted(unknown)}; known: {sorted(known)}")
        merged = {k: raw.get(k, getattr(defaults, k)) for k in known}
        if merged["time"] is None:
            # A backstop only, well above the limit: the control plane enforces max_runtime_s (and
            # max_wait_s) itself with an orderly stop (orchestrator/stopping.py: SIGTERM, the save
            # in flight commits, the job ends Stopped with MaxRuntimeExceeded). Slurm's TIMEOUT at
            # max_runtime_s would race that stop and end the attempt as a failure; this one acts
            # only if the control plane is down that long.
            merged["time"] = str(math.ceil(spec.stopping.max_runtime_s / 60) + SLURM_TIME_BACKSTOP_MIN)  # minutes
        return cls(**merged)


def render_script(
    request: LaunchRequest,
    options: SlurmOptions,
    *,
    job_name: str | None = None,
    nodes: int | None = None,
    exclude: list[str] | None = None,
) -> str:
    """The batch script: checked #SBATCH values and a fixed srun line; nothing else from the user.
    The attempt's allocation by default; a spare allocation names its own job, node count and
    excluded nodes."""
    spec = request.spec
    count = int(spec.resources.instance_count) + spare_nodes(spec) if nodes is None else int(nodes)
    lines = [
        "#!/bin/bash",
        f"# Aerie attempt {_safe(request.attempt_id, 'attempt id')} of job {_safe(request.job_id, 'job id')}.",
        "# Rendered by orchestrator/backends/slurm.py. Every user value is in launch.json beside",
        "# this script ($AERIE_SLURM_LAUNCH); agent.slurm reads it on each node.",
        f"#SBATCH --job-name={_safe(job_name or request.attempt_id, 'job name')}",
        f"#SBATCH --nodes={count}",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --output=slurm-%j.out",
        "#SBATCH --open-mode=append",
    ]
    # The optional text values, each checked, on a line only where set: (option, value, its name).
    texts = [
        ("exclude", ",".join(request.exclude_nodes if exclude is None else exclude), "exclude_nodes"),
        ("partition", options.partition, "partition"),
        ("account", options.account, "account"),
        ("time", str(options.time or ""), "time"),
    ]
    lines += [f"#SBATCH --{option}={_safe(value, what)}" for option, value, what in texts if value]
    if options.gpus_per_node:
        lines.append(f"#SBATCH --gres=gpu:{int(options.gpus_per_node)}")
    if options.cpus_per_task:
        lines.append(f"#SBATCH --cpus-per-task={int(options.cpus_per_task)}")
    # One task per node; if one node's agent fails, Slurm ends the others (the attempt has failed).
    # Not with hot spares: a failed or replaced node's agent exits while the others and a spare go
    # on in place (the control plane ends the allocation: `stop`).
    kill = 0 if spare_nodes(spec) or nodes is not None else 1
    lines += [
        "set -eu",
        f"exec srun --kill-on-bad-exit={kill} --ntasks-per-node=1"
        ' "$AERIE_SLURM_PYTHON" -m agent.slurm "$AERIE_SLURM_LAUNCH"',
        "",
    ]
    return "\n".join(lines)


def launch_document(
    request: LaunchRequest, root: Path, workdir: Path, options: SlurmOptions, in_place_wait_s: float = 0.0
) -> dict[str, Any]:
    """launch.json: what `agent.slurm` needs to build each node's contract and environment (with
    `in_place_wait_s`, agents that wait that long for an in-place successor after a failed group)."""
    spec = request.spec
    attempt = attempt_env(request, workdir)
    if in_place_wait_s > 0:
        attempt.update(in_place_env(spec, in_place_wait_s))
    return {
        "root": str(root),
        "workdir": str(workdir),
        "hyperparameters": dict(spec.hyperparameters),
        "channels": channels(spec),
        "network_interface": options.network_interface,
        "master_port": options.master_port,
        # The first `nodes` of the job's sorted hosts run the attempt; the others are hot spares.
        "nodes": int(spec.resources.instance_count),
        "env": {"user": dict(spec.env), "extra": dict(request.extra_env), "attempt": attempt},
    }


def spare_nodes(spec: Any) -> int:
    """How many hot spares the allocation holds: `resources.spare_nodes` where the agents wait
    between attempts (in-place restarts possible), else none (as on the local backend)."""
    return int(spec.resources.spare_nodes) if in_place_on(spec) else 0


def _safe(value: str, what: str) -> str:
    if not SAFE_VALUE.match(value):
        raise ValueError(f"{what} {value!r} cannot go on an #SBATCH line (allowed: {SAFE_VALUE.pattern})")
    return value
