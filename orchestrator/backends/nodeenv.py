"""The environment every backend gives a node's agent: the contract's SM_* plus Aerie's AERIE_*.

One place, so that `local`, `slurm` and `sagemaker` nodes see the same variables. The layers, in
order (a later one wins): the launcher's own environment minus any AERIE_*/SM_* of its own, the
spec's `env`, the node's contract (`NodeContract.env()`), the request's `extra_env`, the attempt's
AERIE_* variables, and the rendezvous address. Slurm builds the node half on the node itself
(`agent.slurm`), from the attempt half computed here.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping

from agent.contract import NodeContract
from orchestrator.backends.base import LaunchRequest


def checkpoint_uri(spec: Any, job_id: str) -> str:
    """`<checkpoint.s3_uri>/<job id>`: every attempt of a job shares it, so attempt N+1 finds N's."""
    if not spec.checkpoint or not spec.checkpoint.s3_uri:
        return ""
    return spec.checkpoint.s3_uri.rstrip("/") + "/" + job_id


def attempt_env(request: LaunchRequest, workdir: Path | str) -> dict[str, str]:
    """The AERIE_* variables that are the same on every node of the attempt."""
    spec = request.spec
    return {
        "AERIE_API": request.api_url,
        "AERIE_AGENT_TOKEN": request.agent_token,
        "AERIE_ATTEMPT": request.attempt_id,
        "AERIE_ATTEMPT_NUMBER": str(request.attempt_number),
        "AERIE_JOB": request.job_id,
        "AERIE_RESUME_FROM": request.resume_from or "",
        "AERIE_CHECKPOINT_URI": checkpoint_uri(spec, request.job_id),
        "AERIE_CHECKPOINT_EVERY": str(spec.checkpoint.every_steps) if spec.checkpoint else "",
        "AERIE_HEALTH": spec.health.model_dump_json(),
        "AERIE_PROCS_PER_NODE": str(spec.resources.procs_per_node),
        "AERIE_ENTRYPOINT": json.dumps(list(spec.entrypoint) + list(spec.args)),
        "AERIE_WORKDIR": str(workdir),
        "PYTHONUNBUFFERED": "1",
    }


def inherited_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The launcher's environment without its own AERIE_*/SM_* (they belong to the control plane)."""
    base = os.environ if base is None else base
    return {k: v for k, v in base.items() if not k.startswith(("AERIE_", "SM_"))}


def node_env(request: LaunchRequest, contract: NodeContract, master_addr: str, master_port: int,
             workdir: Path | str) -> dict[str, str]:
    """The whole environment of one node's agent, built where the contract is known."""
    env = inherited_env()
    env.update(request.spec.env)
    env.update(contract.env())
    env.update(request.extra_env)
    env.update(attempt_env(request, workdir))
    env.update({"AERIE_MASTER_ADDR": master_addr, "AERIE_MASTER_PORT": str(master_port)})
    return env
