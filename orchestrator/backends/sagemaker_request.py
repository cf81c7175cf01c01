"""The CreateTrainingJob request of one attempt of the `sagemaker` backend, and the names in it.

Built from `sagemaker_mapping.request_from_spec`, with an attempt-unique `TrainingJobName`, Aerie's
environment (API URL, agent token, attempt, resume point, checkpoint URI) and `aerie:*` tags that
let SageMaker's own events be traced back to the attempt. Inside the container the image's agent
(`python -m agent.entrypoint`) runs the user's entrypoint, exactly as on the local and Slurm
backends. Hot spares are extra instances of the same request (`InstanceCount` = nodes + spares).
A pure function of the launch request, so the tests check it against golden files alone.
"""

from __future__ import annotations

from typing import Any

from aerie_contracts import env as aerie_env
from orchestrator.backends import in_place
from orchestrator.backends.base import LaunchRequest
from orchestrator.backends.nodeenv import (
    attempt_env,
    checkpoint_marker_env,
    in_place_env,
    in_place_on,
    log_metrics_env,
    memory_attempt_env,
    sagemaker_sync_uri,
)
from orchestrator.sagemaker_mapping import request_from_spec

NAME_MAX = 63
# The Aerie image's entrypoint: PID 1 wrapper -> agent -> the user's entrypoint (AERIE_ENTRYPOINT).
AGENT_ENTRYPOINT = ["python", "-m", "agent.entrypoint"]
ENV_VALUE_MAX = 512  # SageMaker's limit on one Environment value
IN_PLACE_WAIT_S = 120.0  # SageMakerBackend.in_place_wait_s


def training_job_name(request: LaunchRequest) -> str:
    """`<job id>-a<N>`: unique per attempt (SageMaker names are unique per account and region)."""
    suffix = f"-a{request.attempt_number}"
    return request.job_id[: NAME_MAX - len(suffix)].rstrip("-") + suffix


def spare_hosts(spec: Any) -> list[str]:
    """The training job's hot spares (`resources.spare_nodes`): extra instances after the attempt's
    own (`algo-N+1..`), whose agents wait for a failed node's rank slot (AERIE_SPARE_HOSTS). None
    without in-place restarts: there would be no way to hand one a slot."""
    if not in_place_on(spec):
        return []
    count = spec.resources.instance_count
    return [f"algo-{count + i + 1}" for i in range(spec.resources.spare_nodes)]


def in_place_port(spec: Any, restarts: int) -> int:
    """The rendezvous port of the training job's `restarts`-th in-place attempt: the job's own
    (`backend_options.master_port`, else the agents' default) moved up by `restarts`, so that a
    new worker group never joins a store the last group's rank 0 may still serve."""
    base = int((spec.backend_options or {}).get("master_port") or aerie_env.DEFAULT_MASTER_PORT)
    return in_place.rendezvous_port(base, restarts)


def create_training_job_request(
    request: LaunchRequest,
    defaults: dict[str, Any] | None = None,
    in_place_wait_s: float = IN_PLACE_WAIT_S,
    *,
    memory_key: str | None = None,
) -> dict[str, Any]:
    """The CreateTrainingJob request of one attempt (whose agents, where the job may restart in
    place, wait `in_place_wait_s` after a failed worker group: `in_place_env`; with `memory_key`,
    they run the in-memory checkpoint tier with it)."""
    spec = request.spec
    options = dict(spec.backend_options or {})
    carried = {**(defaults or {}), **(options.get("sagemaker") or {})}
    agent_entrypoint = list(options.get("agent_entrypoint") or AGENT_ENTRYPOINT)
    workdir = options.get("container_workdir") or "/opt/ml/code"
    body = request_from_spec(spec.model_copy(update={"backend_options": {**options, "sagemaker": carried}}))
    body["TrainingJobName"] = training_job_name(request)
    # No RetryStrategy: Aerie chains attempts itself (in place inside this training job, or a new
    # one resumed from the last good checkpoint, bad nodes excluded); SageMaker's own retries would hide failures
    # from chaining and restart without the resume point.
    body.pop("RetryStrategy", None)
    # The image's agent runs the user's entrypoint (AERIE_ENTRYPOINT), as on every backend.
    algo = body["AlgorithmSpecification"]
    algo["ContainerEntrypoint"] = agent_entrypoint
    algo.pop("ContainerArguments", None)
    # Aerie's checkpoints (AERIE_CHECKPOINT_URI = <s3_uri>/<job id>, shared by every attempt) stream
    # to and from S3 and never go through CheckpointConfig, which would have SageMaker copy all of
    # them to /opt/ml/checkpoints at every start. SageMaker's sync only if the spec asks, elsewhere.
    sync_uri = sagemaker_sync_uri(spec, request.job_id)
    if "CheckpointConfig" in body and sync_uri:
        body["CheckpointConfig"]["S3Uri"] = sync_uri
    aerie = attempt_env(request, workdir)
    aerie.pop("TRAINING_JOB_NAME")  # SageMaker sets it in the container itself
    # No rendezvous address: each node reads it from resourceconfig.json (the first sorted host,
    # by name); the port is fixed (agent.identity's default) unless the spec names one.
    if options.get("master_port"):
        aerie[aerie_env.MASTER_PORT] = str(options["master_port"])
    # Only the health fields the spec changed: the whole section nears SageMaker's 512-character cap
    # on one Environment value, and the agent fills the rest with the same defaults (tested).
    aerie[aerie_env.HEALTH] = spec.health.model_dump_json(exclude_defaults=True)
    aerie.update(log_metrics_env(spec))
    aerie.update(checkpoint_marker_env(spec))
    aerie.update(in_place_env(spec, in_place_wait_s))
    if memory_key:
        aerie.update(memory_attempt_env(spec, memory_key))
    spares = spare_hosts(spec)
    if spares:
        body["ResourceConfig"]["InstanceCount"] = spec.resources.instance_count + len(spares)
        aerie[aerie_env.SPARE_HOSTS] = ",".join(spares)
    environment = {**body.get("Environment", {}), **request.extra_env, **aerie}
    too_long = sorted(k for k, v in environment.items() if len(v) > ENV_VALUE_MAX)
    if too_long:
        raise ValueError(
            f"SageMaker limits Environment values to {ENV_VALUE_MAX} characters; too long: "
            f"{too_long} (move long entrypoint arguments into hyperparameters)"
        )
    body["Environment"] = environment
    tags = [t for t in body.get("Tags", []) if not t["Key"].startswith("aerie:")]
    tags += [
        {"Key": "aerie:job", "Value": request.job_id},
        {"Key": "aerie:job-name", "Value": request.job_name},
        {"Key": "aerie:attempt", "Value": request.attempt_id},
    ]
    body["Tags"] = tags
    return body
