"""Translate between Aerie's JobSpec and SageMaker's CreateTrainingJob request.

Kept apart from spec.py so the spec reads as a plain data model. The mapping follows the table
in the architecture; fields SageMaker has and Aerie does not model (RoleArn, VpcConfig, ...) are
carried in `backend_options["sagemaker"]` so a request survives the round trip unchanged.

Over 400 lines on purpose: both directions of one field table side by side, so a field added to
one direction is seen missing from the other.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import re
from typing import Any

from aerie_contracts import sagemaker_api as contract
from aerie_contracts.checkpoints import step_of_uri
from aerie_contracts.failures import stop_limit
from aerie_contracts.states import JOB_TERMINAL, AttemptState, JobState
from orchestrator.spec import JobSpec

DEFAULT_ENTRYPOINT = ["python", "-m", "trainer.train"]
# Request keys the mapping below understands; everything else is carried through verbatim.
_MAPPED = {
    "TrainingJobName",
    "HyperParameters",
    "AlgorithmSpecification",
    "InputDataConfig",
    "OutputDataConfig",
    "ResourceConfig",
    "StoppingCondition",
    "CheckpointConfig",
    "RetryStrategy",
    "Environment",
    "Tags",
}


def spec_dict_from_request(request: dict[str, Any]) -> dict[str, Any]:
    """A CreateTrainingJob request as a JobSpec dict (validated by the caller)."""
    algo = request.get("AlgorithmSpecification") or {}
    resources = request.get("ResourceConfig") or {}
    spec: dict[str, Any] = {
        "name": request.get("TrainingJobName"),
        "image": algo.get("TrainingImage", "aerie/trainer:latest"),
        "entrypoint": algo.get("ContainerEntrypoint") or DEFAULT_ENTRYPOINT,
        "args": algo.get("ContainerArguments") or [],
        "hyperparameters": request.get("HyperParameters") or {},
        "inputs": [_channel_from_request(c) for c in request.get("InputDataConfig") or []],
        "output": {"s3_uri": (request.get("OutputDataConfig") or {}).get("S3OutputPath")},
        "resources": {
            "instance_type": resources.get("InstanceType", "local"),
            "instance_count": resources.get("InstanceCount", 1),
            "volume_gb": resources.get("VolumeSizeInGB", 30),
        },
        "env": request.get("Environment") or {},
        "tags": {t["Key"]: t["Value"] for t in request.get("Tags") or []},
        "backend": "sagemaker",
    }
    if algo.get("MetricDefinitions"):  # SageMaker reads them from the logs; so does every Aerie node
        spec["metrics"] = {"definitions": algo["MetricDefinitions"]}
    if "StoppingCondition" in request:
        stop = request["StoppingCondition"]
        spec["stopping"] = {"max_runtime_s": stop.get("MaxRuntimeInSeconds", 86400)}
        if stop.get("MaxWaitTimeInSeconds") is not None:  # enforced on every backend (orchestrator/stopping.py)
            spec["stopping"]["max_wait_s"] = stop["MaxWaitTimeInSeconds"]
    if "CheckpointConfig" in request:  # a SageMaker launcher's CheckpointConfig asks for SageMaker's sync
        ck = request["CheckpointConfig"]
        spec["checkpoint"] = {"s3_uri": ck.get("S3Uri"), "sagemaker_sync": True}
        if ck.get("LocalPath"):
            spec["checkpoint"]["local_path"] = ck["LocalPath"]
    # SageMaker retries nothing unless asked; keep that meaning.
    spec["retry"] = {"max_restarts": (request.get("RetryStrategy") or {}).get("MaximumRetryAttempts", 0)}

    carried: dict[str, Any] = {k: v for k, v in request.items() if k not in _MAPPED}
    algo_extra = {
        k: v for k, v in algo.items() if k not in {"TrainingImage", "ContainerEntrypoint", "ContainerArguments"}
    }
    if algo_extra:
        carried["AlgorithmSpecification"] = algo_extra
    if "ContainerEntrypoint" not in algo:
        carried["_image_entrypoint"] = True  # the image's own ENTRYPOINT was meant; don't invent one
    if "OutputDataConfig" in request:
        extra = {k: v for k, v in request["OutputDataConfig"].items() if k != "S3OutputPath"}
        if extra:
            carried["OutputDataConfig"] = extra
    resource_extra = {
        k: v for k, v in resources.items() if k not in {"InstanceType", "InstanceCount", "VolumeSizeInGB"}
    }
    if resource_extra:
        carried["ResourceConfig"] = resource_extra
    spec["backend_options"] = {"sagemaker": carried}
    return spec


def _channel_from_request(channel: dict[str, Any]) -> dict[str, Any]:
    s3 = (channel.get("DataSource") or {}).get("S3DataSource") or {}
    return {
        "channel": channel.get("ChannelName"),
        "s3_uri": s3.get("S3Uri"),
        "mode": channel.get("InputMode", "File"),
        "distribution": s3.get("S3DataDistributionType", "FullyReplicated"),
    }


def spec_from_request(request: dict[str, Any]) -> JobSpec:
    """A CreateTrainingJob request as a validated JobSpec."""
    return JobSpec.model_validate(spec_dict_from_request(request))


def spec_from_document(data: dict[str, Any]) -> JobSpec:
    """A job spec document in either form: Aerie's own, or a raw CreateTrainingJob request
    (recognised by its `AlgorithmSpecification`), so a SageMaker user can submit theirs as is."""
    if isinstance(data, dict) and "AlgorithmSpecification" in data:
        return spec_from_request(data)
    return JobSpec.from_dict(data)


def request_from_spec(spec: JobSpec) -> dict[str, Any]:
    """The CreateTrainingJob request that runs this spec on SageMaker."""
    carried = dict((spec.backend_options or {}).get("sagemaker") or {})
    if not spec.resources.instance_type.startswith("ml."):
        raise ValueError(
            f"resources.instance_type {spec.resources.instance_type!r} is not a SageMaker instance "
            "type (ml.*): set one to run on SageMaker"
        )
    role = carried.pop("RoleArn", None)
    if not role:
        raise ValueError("SageMaker needs an execution role: set backend_options.sagemaker.RoleArn")

    algo: dict[str, Any] = {"TrainingImage": spec.image, "TrainingInputMode": "File"}
    algo.update(carried.pop("AlgorithmSpecification", {}))
    if not carried.pop("_image_entrypoint", False):
        algo["ContainerEntrypoint"] = list(spec.entrypoint)
    if spec.args:
        algo["ContainerArguments"] = list(spec.args)

    request: dict[str, Any] = {
        "TrainingJobName": spec.name,
        "RoleArn": role,
        "AlgorithmSpecification": algo,
        "OutputDataConfig": {"S3OutputPath": spec.output.s3_uri or "", **carried.pop("OutputDataConfig", {})},
        "ResourceConfig": {
            "InstanceType": spec.resources.instance_type,
            "InstanceCount": spec.resources.instance_count,
            "VolumeSizeInGB": spec.resources.volume_gb,
            **carried.pop("ResourceConfig", {}),
        },
        "StoppingCondition": {"MaxRuntimeInSeconds": spec.stopping.max_runtime_s},
    }
    if spec.stopping.max_wait_s is not None and carried.get("EnableManagedSpotTraining"):
        # SageMaker takes MaxWaitTimeInSeconds for managed spot training only.
        request["StoppingCondition"]["MaxWaitTimeInSeconds"] = spec.stopping.max_wait_s
    if not spec.output.s3_uri:
        raise ValueError("SageMaker needs output.s3_uri (OutputDataConfig.S3OutputPath)")
    if spec.hyperparameters:
        request["HyperParameters"] = dict(spec.hyperparameters)
    if spec.inputs:
        request["InputDataConfig"] = [
            {
                "ChannelName": c.channel,
                "DataSource": {
                    "S3DataSource": {
                        "S3DataType": "S3Prefix",
                        "S3Uri": c.s3_uri,
                        "S3DataDistributionType": c.distribution,
                    }
                },
                "InputMode": c.mode,
            }
            for c in spec.inputs
        ]
    if "CheckpointLocalPath" in carried:
        raise ValueError(
            "backend_options.sagemaker.CheckpointLocalPath is gone: Aerie's checkpoints stream to S3 and are "
            "never staged; for SageMaker's own sync of a local directory set checkpoint.sagemaker_sync: true "
            "and checkpoint.local_path"
        )
    # No CheckpointConfig unless asked for: SageMaker would copy every checkpoint under S3Uri to local
    # disk at each start (whole-checkpoint staging, which Aerie's streaming restore exists to avoid).
    if spec.checkpoint and spec.checkpoint.s3_uri and spec.checkpoint.sagemaker_sync:
        request["CheckpointConfig"] = {"S3Uri": spec.checkpoint.s3_uri}
        if spec.checkpoint.local_path:
            request["CheckpointConfig"]["LocalPath"] = spec.checkpoint.local_path
    if spec.retry.max_restarts > 0:
        request["RetryStrategy"] = {"MaximumRetryAttempts": min(spec.retry.max_restarts, 30)}
    if spec.env:
        request["Environment"] = dict(spec.env)
    if spec.tags:
        request["Tags"] = [{"Key": k, "Value": v} for k, v in spec.tags.items()]
    request.update(carried)
    return request


# === The SageMaker-compatible endpoint: a request served by an Aerie backend, and its answers ====
#
# `orchestrator/sagemaker_api` speaks the protocol; what a request means on a backend and what
# DescribeTrainingJob / ListTrainingJobs answer is decided here, next to the request mapping above.

TRAINING_LOG_GROUP = contract.TRAINING_LOG_GROUP
BACKEND_TAG = contract.BACKEND_TAG
HEALTH_TAG = contract.HEALTH_TAG
STATUS_OF_STATE = {JobState.SUBMITTED: "InProgress", JobState.IN_PROGRESS: "InProgress"}
# ListTrainingJobs' StatusEquals as (Aerie job states, stop requested?).
STATES_OF_STATUS: dict[str, tuple[tuple[str, ...], bool | None]] = {
    "InProgress": ((JobState.SUBMITTED, JobState.IN_PROGRESS), False),
    "Stopping": ((JobState.SUBMITTED, JobState.IN_PROGRESS), True),
    "Completed": ((JobState.COMPLETED,), None),
    "Failed": ((JobState.FAILED,), None),
    "Stopped": ((JobState.STOPPED,), None),
    "Deleting": ((), None),
}
# Request fields Aerie stores and returns but applies only on the sagemaker backend.
SAGEMAKER_ONLY = (
    "DebugHookConfig",
    "DebugRuleConfigurations",
    "ProfilerConfig",
    "ProfilerRuleConfigurations",
    "TensorBoardOutputConfig",
    "ExperimentConfig",
    "RemoteDebugConfig",
    "InfraCheckConfig",
    "SessionChainingConfig",
    "ServerlessJobConfig",
    "MlflowConfig",
    "ModelPackageConfig",
)
# Spec fields as the request names them, for validation messages: the request's members from
# the spec's path (`*`: any list index; the longest match wins, the rest of the path follows
# lowerCamelCased). Maps (HyperParameters, Environment, Tags) are reported at the map, as AWS does.
_REQUEST_PATH: dict[tuple[str, ...], tuple[str, ...]] = {
    ("name",): ("TrainingJobName",),
    ("image",): ("AlgorithmSpecification", "TrainingImage"),
    ("entrypoint",): ("AlgorithmSpecification", "ContainerEntrypoint"),
    ("args",): ("AlgorithmSpecification", "ContainerArguments"),
    ("metrics",): ("AlgorithmSpecification", "MetricDefinitions"),
    ("metrics", "definitions"): ("AlgorithmSpecification", "MetricDefinitions"),
    ("hyperparameters",): ("HyperParameters",),
    ("inputs",): ("InputDataConfig",),
    ("inputs", "*"): ("InputDataConfig", "*"),
    ("inputs", "*", "channel"): ("InputDataConfig", "*", "ChannelName"),
    ("inputs", "*", "s3_uri"): ("InputDataConfig", "*", "DataSource", "S3DataSource", "S3Uri"),
    ("inputs", "*", "mode"): ("InputDataConfig", "*", "InputMode"),
    ("inputs", "*", "distribution"): ("InputDataConfig", "*", "DataSource", "S3DataSource", "S3DataDistributionType"),
    ("output",): ("OutputDataConfig",),
    ("output", "s3_uri"): ("OutputDataConfig", "S3OutputPath"),
    ("resources",): ("ResourceConfig",),
    ("resources", "instance_type"): ("ResourceConfig", "InstanceType"),
    ("resources", "instance_count"): ("ResourceConfig", "InstanceCount"),
    ("resources", "volume_gb"): ("ResourceConfig", "VolumeSizeInGB"),
    ("stopping",): ("StoppingCondition",),
    ("stopping", "max_runtime_s"): ("StoppingCondition", "MaxRuntimeInSeconds"),
    ("stopping", "max_wait_s"): ("StoppingCondition", "MaxWaitTimeInSeconds"),
    ("checkpoint",): ("CheckpointConfig",),
    ("checkpoint", "s3_uri"): ("CheckpointConfig", "S3Uri"),
    ("checkpoint", "local_path"): ("CheckpointConfig", "LocalPath"),
    ("retry",): ("RetryStrategy",),
    ("retry", "max_restarts"): ("RetryStrategy", "MaximumRetryAttempts"),
    ("env",): ("Environment",),
    ("tags",): ("Tags",),
}
_MAPS = {"HyperParameters", "Environment", "Tags"}


class Unsupported(ValueError):
    """A request this backend cannot run at all (refused with ValidationException, naming why)."""


def account_id(tenant: str) -> str:
    """The 12-digit AWS account a tenant appears as in ARNs (stable, distinct per tenant)."""
    return str(int(hashlib.sha256(tenant.encode()).hexdigest(), 16) % 10**12).zfill(12)


def training_job_arn(region: str, tenant: str, name: str) -> str:
    # SageMaker lower-cases the name in a training job's ARN.
    return f"arn:aws:sagemaker:{region}:{account_id(tenant)}:training-job/{name.lower()}"


def request_field(loc: tuple[Any, ...], request: dict[str, Any] | None = None) -> str:
    """The AWS field path (`resourceConfig.instanceCount`, `inputDataConfig.1.member.inputMode`)
    of the request member a spec validation error at `loc` (pydantic's) comes from. The health
    thresholds come from the `aerie:health` tag: its value in `tags.N.member.value`. An error of
    the whole spec (`loc` empty) has no path: ""."""
    from orchestrator.sagemaker_api.shapes import aws_path

    if not loc:
        return ""
    if loc[0] == "health":
        tags = (request or {}).get("Tags") or []
        index = next((i for i, t in enumerate(tags) if isinstance(t, dict) and t.get("Key") == HEALTH_TAG), None)
        return aws_path(["Tags", index, "Value"]) if index is not None else "tags"
    pattern = tuple("*" if isinstance(p, int) and not isinstance(p, bool) else str(p) for p in loc)
    for n in range(len(loc), 0, -1):
        target = _REQUEST_PATH.get(pattern[:n])
        if target is None:
            continue
        indexes = iter(p for p in loc[:n] if isinstance(p, int) and not isinstance(p, bool))
        head = [next(indexes) if t == "*" else t for t in target]
        rest = [] if target[0] in _MAPS else list(loc[n:])
        return aws_path([*head, *rest])
    return aws_path(loc)


def backend_limits(request: dict[str, Any], backend: str) -> list[str]:
    """What `backend` cannot honour of this request: raises Unsupported for what it cannot run,
    and returns a warning ("Field: what happens instead") for each field it stores but does not
    apply. The sagemaker backend hands the request to SageMaker, which honours all of it."""
    if backend == "sagemaker":
        return []
    warnings: list[str] = []
    algo = request.get("AlgorithmSpecification") or {}
    resources = request.get("ResourceConfig") or {}
    stopping = request.get("StoppingCondition") or {}
    output = request.get("OutputDataConfig") or {}
    if algo.get("AlgorithmName") and not algo.get("TrainingImage"):
        raise Unsupported("algorithmSpecification.algorithmName: marketplace algorithms run only on SageMaker")
    if not algo.get("ContainerEntrypoint"):
        # Without a container there is no image ENTRYPOINT to fall back to: running anything else
        # (Aerie's own trainer, say) would silently run the wrong program.
        toolkit = (
            " (an SDK framework estimator's entry_point needs the sagemaker-training toolkit of AWS's framework images)"
            if "sagemaker_program" in (request.get("HyperParameters") or {})
            else ""
        )
        raise Unsupported(
            f"algorithmSpecification.containerEntrypoint: the {backend} backend runs a command, not an image's "
            "ENTRYPOINT; give the command (ContainerEntrypoint and ContainerArguments, or the SDK's "
            f"SourceCode(command=...)), or run it on SageMaker (tag {BACKEND_TAG}=sagemaker){toolkit}"
        )
    if resources.get("InstanceGroups"):
        raise Unsupported("resourceConfig.instanceGroups: heterogeneous clusters run only on SageMaker")
    # Each channel's input mode, at its AWS field path (a channel without one takes the job's).
    modes = {"algorithmSpecification.trainingInputMode": algo.get("TrainingInputMode") or "File"}
    for i, channel in enumerate(request.get("InputDataConfig") or []):
        source = channel.get("DataSource") or {}
        where = f"inputDataConfig.{i + 1}.member"
        name = f"channel {channel.get('ChannelName')}"
        if "FileSystemDataSource" in source:
            raise Unsupported(
                f"{where}.dataSource.fileSystemDataSource ({name}): file-system channels (EFS, FSx for Lustre) "
                "run only on SageMaker"
            )
        s3 = source.get("S3DataSource") or {}
        if s3.get("S3DataType", "S3Prefix") != "S3Prefix":
            raise Unsupported(
                f"{where}.dataSource.s3DataSource.s3DataType ({name}): {s3['S3DataType']} runs only on SageMaker "
                "(use S3Prefix)"
            )
        if channel.get("InputMode"):
            modes[f"{where}.inputMode"] = channel["InputMode"]
    piped = [path for path, mode in modes.items() if mode == "Pipe"]
    if piped:
        raise Unsupported(f"{', '.join(piped)}: InputMode Pipe runs only on SageMaker (use File or FastFile)")
    modes_used = set(modes.values())
    if "FastFile" in modes_used:
        warnings.append(
            "InputMode: FastFile is not a mount here: the channel directory stays empty and the data is read "
            "from S3 (SM_CHANNEL_<NAME>_S3_URI; Aerie's trainer streams its Megatron datasets)"
        )
    if algo.get("TrainingImage"):
        warnings.append(
            f"AlgorithmSpecification.TrainingImage: not pulled; the {backend} backend runs the command in its own "
            "Python environment in place of the image"
        )
    for key in ("TrainingImageConfig", "EnableSageMakerMetricsTimeSeries"):
        if key in algo:
            warnings.append(f"AlgorithmSpecification.{key}: stored, not applied")
    if resources.get("InstanceType"):
        warnings.append(
            f"ResourceConfig.InstanceType: each of the {resources.get('InstanceCount', 1)} instances "
            f"is one {backend} node"
        )
    if resources.get("VolumeKmsKeyId"):
        warnings.append("ResourceConfig.VolumeKmsKeyId: not applied, node storage is not encrypted with this key")
    if resources.get("KeepAlivePeriodInSeconds"):
        warnings.append("ResourceConfig.KeepAlivePeriodInSeconds: no warm pools, nodes end with the job")
    if output.get("KmsKeyId"):
        warnings.append("OutputDataConfig.KmsKeyId: not applied, artifacts get the bucket's default encryption")
    if output.get("CompressionType", "GZIP") != "GZIP":
        warnings.append("OutputDataConfig.CompressionType: not applied, the model is uploaded as model.tar.gz")
    if request.get("VpcConfig"):
        warnings.append(f"VpcConfig: not applied, {backend} nodes use the host's network")
    if request.get("EnableNetworkIsolation"):
        warnings.append("EnableNetworkIsolation: not enforced")
    if request.get("EnableInterContainerTrafficEncryption"):
        warnings.append("EnableInterContainerTrafficEncryption: not applied")
    if request.get("EnableManagedSpotTraining"):
        warnings.append(
            "EnableManagedSpotTraining: runs on-demand (no spot capacity to wait for or lose), billed for all of it"
        )
    if stopping.get("MaxPendingTimeInSeconds"):
        warnings.append("StoppingCondition.MaxPendingTimeInSeconds: ignored (no pending capacity)")
    checkpoint = request.get("CheckpointConfig") or {}
    if checkpoint.get("S3Uri"):
        warnings.append(
            "CheckpointConfig.S3Uri: Aerie's trainer checkpoints to <S3Uri>/<Aerie job id>/ (its manifest-committed "
            "layout); LocalPath is not synced"
        )
    for key in SAGEMAKER_ONLY:
        if request.get(key):
            warnings.append(f"{key}: stored, not applied")
    return warnings


def endpoint_spec(request: dict[str, Any], backend: str) -> dict[str, Any]:
    """The JobSpec dict (validated by the caller) that runs a request on `backend`."""
    spec = spec_dict_from_request(request)
    spec["backend"] = backend
    tags = spec.get("tags") or {}
    if tags.get(HEALTH_TAG):
        try:
            spec["health"] = json.loads(tags[HEALTH_TAG])
        except ValueError:
            raise Unsupported(
                f"{request_field(('health',), request)} (tag {HEALTH_TAG}): not JSON (give the health thresholds "
                'to change, e.g. {"hang_floor_s": 60})'
            ) from None
    if backend == "local":
        # SageMaker's containers see their node at /opt/ml: so do local nodes (a private mount).
        spec["backend_options"]["container_paths"] = True
    if backend != "sagemaker" and (request.get("OutputDataConfig") or {}).get("S3OutputPath"):
        # SageMaker uploads model/ when the job succeeds; elsewhere the first node's agent does.
        spec["backend_options"]["model_artifacts_uri"] = model_artifacts_uri(request)
    return spec


# --- answers ---------------------------------------------------------------------------------------


def training_job_status(job: Any) -> str:
    if job.state in JOB_TERMINAL:
        return job.state
    return "Stopping" if job.stop_requested else "InProgress"


def _will_restart(job: Any, attempt: Any) -> bool:
    """Whether chaining will follow this failed attempt with another: the recovery package's rules."""
    from recovery.policy import will_retry

    return will_retry(job.spec or {}, attempt.number, attempt.reason or {})


def _step(uri: str | None) -> str:
    step = step_of_uri(uri)
    return f"step {step}" if step is not None else "the start (no checkpoint yet)"


def secondary_transitions(job: Any, warnings: list[str], backend: str, now: float) -> list[dict[str, Any]]:
    """SageMaker's SecondaryStatusTransitions, from the job's attempts: Starting, Downloading (the
    launch: channels downloaded, nodes started), Training per attempt, Restarting between a failed
    attempt and the next (its message names the cause and the resume point), Uploading (the model
    upload the agent reports), then Completed / Failed / Stopping, Stopped."""
    steps: list[tuple[str, float, str]] = []
    message = f"Starting the training job on Aerie's {backend} backend."
    if warnings:
        message += " Not honoured on this backend: " + "; ".join(warnings) + "."
    steps.append(("Starting", job.created_at, message))
    attempts = sorted(job.attempts, key=lambda a: a.number)
    for i, a in enumerate(attempts):
        if i == 0:
            steps.append(("Downloading", a.created_at, "Downloading input data and starting the nodes"))
        else:
            prev = attempts[i - 1]
            reason = prev.reason or {}
            steps.append(
                (
                    "Restarting",
                    prev.ended_at or a.created_at,
                    f"Attempt {prev.number} ended with {reason.get('kind', 'a failure')}"
                    + (f" ({str(reason.get('message'))[:300]})" if reason.get("message") else "")
                    + f"; attempt {a.number} resumes from {_step(a.resume_from)}",
                )
            )
        if a.started_at:
            steps.append(("Training", a.started_at, f"Training in progress (attempt {a.number})"))
        uploading = [
            float(n.summary[contract.PHASE_SINCE])
            for n in a.nodes
            if n.summary
            and n.summary.get(contract.PHASE) == contract.PHASE_UPLOADING
            and n.summary.get(contract.PHASE_SINCE)
        ]
        if uploading and a.state in (AttemptState.RUNNING, AttemptState.COMPLETED):
            steps.append(("Uploading", min(uploading), "Uploading generated training model"))
    last = attempts[-1] if attempts else None
    if job.state not in JOB_TERMINAL:
        if (
            last is not None
            and last.state == AttemptState.FAILED
            and not job.stop_requested
            and _will_restart(job, last)
        ):
            reason = last.reason or {}
            steps.append(
                (
                    "Restarting",
                    last.ended_at or now,
                    f"Attempt {last.number} ended with {reason.get('kind')}; restarting from the last good checkpoint",
                )
            )
        if job.stop_requested:
            steps.append(("Stopping", job.updated_at or now, "Stopping the training job"))
    elif job.state == JobState.COMPLETED:
        steps.append(("Completed", job.ended_at or now, "Training job completed"))
    elif job.state == JobState.FAILED:
        steps.append(("Failed", job.ended_at or now, "Training job failed"))
    else:
        limit = stop_limit(job.reason)  # stopped for a StoppingCondition: SageMaker's final status names it
        if job.stop_requested or limit is not None:
            steps.append(
                (
                    "Stopping",
                    ((job.reason or {}).get("at") if limit is not None else None)
                    or (last.ended_at if last and last.ended_at else job.ended_at)
                    or now,
                    "Stopping the training job",
                )
            )
        steps.append(
            (limit.secondary_status, job.ended_at or now, limit.message)
            if limit is not None
            else ("Stopped", job.ended_at or now, "The training job was stopped")
        )
    out: list[dict[str, Any]] = []
    floor = 0.0
    for status, start, msg in steps:
        floor = max(floor, float(start or floor))
        out.append({"Status": status, "StartTime": floor, "StatusMessage": msg})
    for here, nxt in itertools.pairwise(out):
        here["EndTime"] = nxt["StartTime"]
    if job.state in JOB_TERMINAL and out:
        out[-1]["EndTime"] = out[-1]["StartTime"]
    return out


def _training_window(job: Any) -> tuple[float | None, float]:
    """(first attempt's start, seconds billed = each attempt's run time x its instance count)."""
    count = int(((job.spec or {}).get("resources") or {}).get("instance_count", 1))
    started = [a.started_at for a in job.attempts if a.started_at]
    billed = sum((a.ended_at - a.started_at) * count for a in job.attempts if a.started_at and a.ended_at)
    return (min(started) if started else None), billed


def model_artifacts_uri(request: dict[str, Any], job: Any = None) -> str:
    """Where SageMaker puts a job's model: `<S3OutputPath>/<TrainingJobName>/output/model.tar.gz`.
    On the sagemaker backend the training job that ran is the latest attempt's (`<job id>-a<N>`)."""
    base = str((request.get("OutputDataConfig") or {}).get("S3OutputPath") or "").rstrip("/")
    name = request["TrainingJobName"]
    if job is not None and job.backend == "sagemaker":
        handles = [a.handle for a in sorted(job.attempts, key=lambda a: a.number) if getattr(a, "handle", None)]
        name = (handles[-1] or {}).get("training_job_name", name) if handles else name
    return f"{base}/{name}/output/model.tar.gz"


def metric_values(definitions: list[dict[str, Any]], text: str, t: float) -> list[dict[str, Any]]:
    """FinalMetricDataList: each MetricDefinition's last match in the job's log (group 1, or the
    whole match), as SageMaker scans the algorithm's output with the definition's regex."""
    out = []
    for d in definitions or []:
        try:
            pattern = re.compile(d.get("Regex") or "")
        except re.error:
            continue
        value = None
        for match in pattern.finditer(text):
            raw = match.group(1) if pattern.groups else match.group(0)
            try:
                value = float(raw)
            except (TypeError, ValueError):
                continue
        if value is not None and value == value and abs(value) != float("inf"):
            out.append({"MetricName": d.get("Name"), "Value": value, "Timestamp": t})
    return out


@functools.cache
def _describe_members() -> frozenset[str]:
    import botocore.session

    model = botocore.session.get_session().get_service_model("sagemaker")
    return frozenset(model.operation_model("DescribeTrainingJob").output_shape.members)


def describe_training_job(
    record: Any, job: Any, now: float, final_metrics: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """DescribeTrainingJob's answer: every field of the original request the answer has, the
    job's status, transitions, failure reason, metrics, timings and billable time."""
    request = record.request
    backend = job.backend
    members = _describe_members()
    out: dict[str, Any] = {k: v for k, v in request.items() if k in members}
    out.setdefault("StoppingCondition", {"MaxRuntimeInSeconds": 86400})
    transitions = secondary_transitions(job, list(record.warnings or []), backend, now)
    started, billed = _training_window(job)
    out.update(
        {
            "TrainingJobName": record.name,
            "TrainingJobArn": record.arn,
            "TrainingJobStatus": training_job_status(job),
            "SecondaryStatus": transitions[-1]["Status"],
            "SecondaryStatusTransitions": transitions,
            "ModelArtifacts": {"S3ModelArtifacts": model_artifacts_uri(request, job)},
            "CreationTime": job.created_at,
            "LastModifiedTime": max([job.updated_at or job.created_at] + [t["StartTime"] for t in transitions]),
        }
    )
    if started is not None:
        out["TrainingStartTime"] = started
    if job.state == JobState.FAILED:
        from lambdas.sagemaker_events import failure_reason_text

        out["FailureReason"] = failure_reason_text(job.reason)[:1024]
    if job.state in JOB_TERMINAL and job.ended_at:
        out["TrainingEndTime"] = job.ended_at
        if started is not None:
            out["TrainingTimeInSeconds"] = int(job.ended_at - started)
            out["BillableTimeInSeconds"] = int(billed)
    if final_metrics:
        out["FinalMetricDataList"] = final_metrics
    return out


def training_job_summary(record: Any, job: Any, now: float) -> dict[str, Any]:
    """One ListTrainingJobs entry."""
    transitions = secondary_transitions(job, [], job.backend, now)
    out = {
        "TrainingJobName": record.name,
        "TrainingJobArn": record.arn,
        "CreationTime": job.created_at,
        "TrainingJobStatus": training_job_status(job),
        "SecondaryStatus": transitions[-1]["Status"],
        "LastModifiedTime": max([job.updated_at or job.created_at] + [t["StartTime"] for t in transitions]),
    }
    if job.ended_at and job.state in JOB_TERMINAL:
        out["TrainingEndTime"] = job.ended_at
    return out
