"""What a CreateTrainingJob sent to the SageMaker-compatible endpoint becomes on an Aerie backend.

The spec it runs as (`endpoint_spec`), what the backend cannot run or will not apply of it
(`backend_limits`: refused, or stored with a warning), and the request field a spec validation
error names (`request_field`), so a SageMaker user reads every complaint in their own request's
terms. `orchestrator/sagemaker_api` speaks the protocol; the field table itself is
`orchestrator/sagemaker_mapping.py`.
"""

from __future__ import annotations

import json
from typing import Any

from aerie_contracts.sagemaker_api import BACKEND_TAG, HEALTH_TAG
from orchestrator.sagemaker_answers import model_artifacts_uri
from orchestrator.sagemaker_mapping import spec_dict_from_request

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
