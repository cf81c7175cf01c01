"""Translate between Aerie's JobSpec and SageMaker's CreateTrainingJob request, both directions.

Kept apart from spec.py so the spec reads as a plain data model. The mapping follows the table
in the architecture; fields SageMaker has and Aerie does not model (RoleArn, VpcConfig, ...) are
carried in `backend_options["sagemaker"]` so a request survives the round trip unchanged. Both
directions of the one field table sit side by side, so a field added to one direction is seen
missing from the other.

What the SageMaker-compatible endpoint makes of a request on an Aerie backend is
`orchestrator/sagemaker_api/admission.py`; what it answers about a job is
`orchestrator/sagemaker_answers.py`.
"""

from __future__ import annotations

from typing import Any

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
