"""The environment every backend gives a node's agent: Aerie's AERIE_* variables.

One place, so that `local`, `slurm` and `sagemaker` nodes see the same variables. No SM_*: the
node's identity comes from its `resourceconfig.json`, as on SageMaker, and the agent sets the SM_*
variables for the ranks itself (`agent.toolkit_env.trainer_env`). The layers, in order (a later one
wins): the launcher's own environment minus any AERIE_*/SM_* of its own, the spec's `env`, the
node's contract (`NodeContract.env()`: where its /opt/ml is), the request's `extra_env`, the
attempt's AERIE_* variables, and the rendezvous address. Slurm builds the node half on the node
itself (`agent.slurm`), from the attempt half computed here.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from aerie_contracts import env as aerie_env
from aerie_contracts.container import CHANNEL_CACHE_ENV, NodeContract
from aerie_contracts.restarts import CAUSE_MEMORY_NODES, CAUSE_RESUME_FALLBACK
from orchestrator.backends.base import LaunchRequest
from recovery import modes


def checkpoint_uri(spec: Any, job_id: str) -> str:
    """`<checkpoint.s3_uri>/<job id>`: every attempt of a job shares it, so attempt N+1 finds N's."""
    if not spec.checkpoint or not spec.checkpoint.s3_uri:
        return ""
    return spec.checkpoint.s3_uri.rstrip("/") + "/" + job_id


SAGEMAKER_SYNC_SUFFIX = ".sagemaker-sync"  # job ids never hold a ".": no job's prefix can equal it


def sagemaker_sync_uri(spec: Any, job_id: str) -> str:
    """Where SageMaker's own checkpoint sync (`checkpoint.sagemaker_sync`) keeps `local_path`: beside
    Aerie's `<s3_uri>/<job id>/`, never inside it, so SageMaker never downloads Aerie's checkpoints."""
    if not spec.checkpoint or not spec.checkpoint.s3_uri:
        return ""
    return spec.checkpoint.s3_uri.rstrip("/") + "/" + job_id + SAGEMAKER_SYNC_SUFFIX


def channels(spec: Any) -> dict[str, dict[str, str]]:
    """The spec's input channels as the node contract takes them (aerie_contracts.container.channel_config)."""
    return {c.channel: {"s3_uri": c.s3_uri, "mode": c.mode, "distribution": c.distribution} for c in spec.inputs}


def attempt_env(request: LaunchRequest, workdir: Path | str) -> dict[str, str]:
    """The variables that are the same on every node of the attempt: Aerie's AERIE_*, and
    SageMaker's TRAINING_JOB_NAME (set in every training container; its SDK's drivers read it)."""
    spec = request.spec
    # The operator's per-host channel cache directory (a path valid on every node), if set.
    cache = {CHANNEL_CACHE_ENV: os.environ[CHANNEL_CACHE_ENV]} if os.environ.get(CHANNEL_CACHE_ENV) else {}
    return {
        **cache,
        aerie_env.API: request.api_url,
        aerie_env.AGENT_TOKEN: request.agent_token,
        aerie_env.ATTEMPT: request.attempt_id,
        aerie_env.ATTEMPT_NUMBER: str(request.attempt_number),
        aerie_env.JOB: request.job_id,
        aerie_env.RESUME_FROM: request.resume_from or "",
        aerie_env.CHECKPOINT_URI: checkpoint_uri(spec, request.job_id),
        aerie_env.CHECKPOINT_EVERY: str(spec.checkpoint.every_steps) if spec.checkpoint else "",
        aerie_env.HEALTH: spec.health.model_dump_json(),
        **log_metrics_env(spec),
        **checkpoint_marker_env(spec),
        aerie_env.PROCS_PER_NODE: str(spec.resources.procs_per_node),
        aerie_env.ENTRYPOINT: json.dumps(list(spec.entrypoint) + list(spec.args)),
        aerie_env.WORKDIR: str(workdir),
        "PYTHONUNBUFFERED": "1",
        "TRAINING_JOB_NAME": request.job_name,
    }


def log_metrics_env(spec: Any) -> dict[str, str]:
    """`AERIE_LOG_METRICS` for a spec with a `metrics` section (every rank parses its output)."""
    if getattr(spec, "metrics", None) is None:
        return {}
    return {aerie_env.LOG_METRICS: json.dumps(spec.metrics.model_dump())}


def checkpoint_marker_env(spec: Any) -> dict[str, str]:
    """A third-party trainer's checkpoint directory and completion marker (agent/byo_checkpoints.py)."""
    ck = getattr(spec, "checkpoint", None)
    if ck is None or not getattr(ck, "marker", None):
        return {}
    return {aerie_env.CHECKPOINT_MARKER: ck.marker, aerie_env.CHECKPOINT_LOCAL_PATH: ck.local_path or ""}


def in_place_env(spec: Any, wait_s: float) -> dict[str, str]:
    """`AERIE_IN_PLACE_WAIT_S` for a job whose failed attempt may be restarted in place (on a
    backend that keeps its agents: aerie_contracts.restarts): the agents outlive their worker
    groups and wait this long for the successor. Nothing where it never could be."""
    return {aerie_env.IN_PLACE_WAIT_S: str(wait_s)} if in_place_on(spec) else {}


def in_place_on(spec: Any) -> bool:
    """Whether the job's agents outlive their worker groups (in-place restarts, hot spares):
    `recovery.modes.in_place_on`, for a parsed spec."""
    return modes.in_place_on(spec.model_dump())


def memory_env(spec: Any, host: str, peers: Mapping[str, str], key: str) -> dict[str, str]:
    """The in-memory checkpoint tier's settings for one node (issue #22): the interval, the node's
    own shared-memory area (under the control plane's AERIE_MEMORY_CHECKPOINT_DIR, default
    /dev/shm/aerie-memckpt: every local node shares the host's /dev/shm, so each has a folder of its
    own), the ring's replication endpoints and the attempt's replication key (the same on every node
    of the attempt, a new one for each attempt: `agent.memckpt.replicate.new_key`)."""
    from aerie_contracts import memckpt

    return {
        aerie_env.MEMORY_CHECKPOINT_EVERY: str(spec.checkpoint.memory_every_steps if spec.checkpoint else "auto"),
        aerie_env.MEMORY_CHECKPOINT_DIR: str(memckpt.root_dir() / memckpt.safe_name(host, "host")),
        aerie_env.MEMORY_CHECKPOINT_PEERS: ",".join(f"{h}={addr}" for h, addr in peers.items()),
        aerie_env.MEMORY_CHECKPOINT_KEY: key,
    }


def memory_attempt_env(spec: Any, key: str) -> dict[str, str]:
    """The memory tier's settings that are the same on every node (its interval and the attempt's
    key), for backends whose nodes derive their own area and the ring's endpoints (Slurm:
    `agent.slurm.memory_env`; SageMaker: `agent.memckpt.platform.sagemaker_env`)."""
    every = spec.checkpoint.memory_every_steps if spec.checkpoint else "auto"
    return {aerie_env.MEMORY_CHECKPOINT_EVERY: str(every), aerie_env.MEMORY_CHECKPOINT_KEY: key}


def memory_resume_env(cause: dict[str, Any] | None) -> dict[str, str]:
    """A memory resume point's companions for the nodes (aerie_contracts.restarts): the durable
    fallback, and which node wrote and which holds each rank's snapshot."""
    cause = cause or {}
    env: dict[str, str] = {}
    if cause.get(CAUSE_MEMORY_NODES):
        env[aerie_env.MEMORY_RESUME_NODES] = json.dumps(cause[CAUSE_MEMORY_NODES])
        env[aerie_env.RESUME_FALLBACK] = cause.get(CAUSE_RESUME_FALLBACK) or ""
    return env


def inherited_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The launcher's environment without its own AERIE_*/SM_* (they belong to the control plane)."""
    base = os.environ if base is None else base
    return {k: v for k, v in base.items() if not k.startswith(("AERIE_", "SM_"))}


def node_env(
    request: LaunchRequest, contract: NodeContract, master_addr: str, master_port: int, workdir: Path | str
) -> dict[str, str]:
    """The whole environment of one node's agent, built where the contract is known."""
    env = inherited_env()
    env.update(request.spec.env)
    env.update(contract.env())
    env.update(request.extra_env)
    env.update(attempt_env(request, workdir))
    env.update({aerie_env.MASTER_ADDR: master_addr, aerie_env.MASTER_PORT: str(master_port)})
    return env
