"""The job spec: Aerie's public contract, shaped after SageMaker's CreateTrainingJob.

Users bring what they know from SageMaker (names, channels, resource config) and add Aerie's own
health, retry and eval sections. A raw CreateTrainingJob request is accepted too and converted,
so an existing SageMaker launcher can point at Aerie unchanged.
"""

from __future__ import annotations

import dataclasses
import json
import typing
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    create_model,
    field_validator,
    model_validator,
)

from aerie_contracts import byo
from aerie_contracts.health import HealthSettings, field_bounds
from aerie_contracts.restarts import DEFAULT_IN_PLACE_RESTARTS

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

NAME_PATTERN = r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$"
CHANNEL_PATTERN = r"^[A-Za-z0-9\.\-_]{1,64}$"
S3_OR_FILE_URI = r"^(s3://[^/]+(/.*)?|file://.+|/.+)$"


class _Strict(BaseModel):
    # Unknown fields are errors: a typo in a spec must not silently fall back to a default.
    model_config = ConfigDict(extra="forbid")


class InputChannel(_Strict):
    """SageMaker's Channel: `mode` is its TrainingInputMode, `distribution` its
    S3DataDistributionType (`ShardedByS3Key`: each node gets every n-th object, in key order)."""

    channel: str = Field(pattern=CHANNEL_PATTERN)
    s3_uri: str = Field(pattern=S3_OR_FILE_URI)
    mode: Literal["File", "Pipe", "FastFile"] = "File"
    distribution: Literal["FullyReplicated", "ShardedByS3Key"] = "FullyReplicated"


class OutputConfig(_Strict):
    s3_uri: str | None = Field(default=None, pattern=S3_OR_FILE_URI)


class Resources(_Strict):
    instance_type: str = "local"
    instance_count: int = Field(default=1, ge=1, le=4096)
    procs_per_node: int = Field(default=1, ge=1, le=64)
    volume_gb: int = Field(default=30, ge=1, le=16384)
    # Hot spares (issue #23): extra nodes launched with the attempt whose agents wait without ranks;
    # a lost or blamed node's rank slot goes to one of them in the next attempt. Local, Slurm and
    # SageMaker backends.
    spare_nodes: int = Field(default=0, ge=0, le=64)


class Stopping(_Strict):
    """SageMaker's StoppingCondition, enforced by the control plane on every backend
    (orchestrator/stopping.py): the job is stopped as a user's stop stops it, and ends Stopped."""

    # MaxRuntimeInSeconds: the job's training time, summed over its attempts.
    max_runtime_s: int = Field(default=86400, ge=1, le=28 * 86400)
    # MaxWaitTimeInSeconds (managed spot): wall-clock time from submission, waits included.
    max_wait_s: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _wait_covers_runtime(self) -> Stopping:
        if self.max_wait_s is not None and self.max_wait_s < self.max_runtime_s:
            # SageMaker's own words (a ValidationException there too).
            raise ValueError(
                "Invalid MaxWaitTimeInSeconds. It must be present and be greater than or equal to MaxRuntimeInSeconds"
            )
        return self


# Each checkpoint interval's least step count (the memory tier can be off, the S3 tier cannot)
# and what its error asks for.
_INTERVALS = {
    "every_steps": (1, "a positive step count or 'auto'"),
    "memory_every_steps": (0, "0 (off), a positive step count or 'auto'"),
}


class CheckpointConfig(_Strict):
    s3_uri: str | None = Field(default=None, pattern=S3_OR_FILE_URI)
    # `auto`: the Young–Daly interval √(2·C·MTBF), which the trainer measures for itself (its first
    # save's stall C, its step time) with the allocation's MTBF the control plane passes at launch
    # (trainer/checkpoint/interval.py); the first save at step 100 (`checkpoint.auto_first_steps`).
    every_steps: int | Literal["auto"] = Field(default=100)
    # The in-memory tier (issue #22): snapshots in the nodes' shared memory, replicated to a peer
    # node. `auto`: as often as the measured snapshot cost allows within 1 % of step time
    # (trainer.checkpoint.interval.AutoInterval); a step count; 0: off. S3 stays the durable tier.
    memory_every_steps: int | Literal["auto"] = Field(default="auto")
    keep_last: int = Field(default=3, ge=1)
    keep_every: int | None = Field(default=None, ge=1)
    # SageMaker only. Aerie's checkpoints stream to and from S3 and are never staged on disk; asking
    # for SageMaker's own sync (CheckpointConfig) also copies `local_path` (default /opt/ml/checkpoints)
    # to and from `<s3_uri>/<job id>.sagemaker-sync/` — a prefix apart from Aerie's checkpoints.
    sagemaker_sync: bool = False
    local_path: str | None = Field(default=None, pattern=r"^/.*")
    # A third-party trainer's own checkpoints: how the agent knows one under `local_path` (default
    # /opt/ml/checkpoints, under the node's ML root locally) is complete — a preset
    # (aerie_contracts.byo.MARKERS) or a glob matching its completion marker file. Set, the agent
    # uploads each finished one, commits Aerie's manifest and restores it on a resume.
    marker: str | None = Field(default=None, min_length=1, max_length=200)

    @field_validator("every_steps", "memory_every_steps")
    @classmethod
    def _interval(cls, value: int | str, info: ValidationInfo) -> int | str:
        least, wanted = _INTERVALS[str(info.field_name)]
        if isinstance(value, int) and value < least:
            raise ValueError(f"{info.field_name}: {wanted}")
        return value

    @field_validator("marker")
    @classmethod
    def _known_marker(cls, value: str | None) -> str | None:
        if value is not None and value not in byo.MARKERS and not any(c in value for c in "*?["):
            raise ValueError(f"marker: one of {', '.join(byo.MARKERS)}, or a glob such as 'ckpt-*/DONE'")
        if value is not None and (value.startswith("/") or ".." in value.split("/")):
            raise ValueError("marker: a glob relative to local_path")
        return value

    @model_validator(mode="after")
    def _local_path_needs_a_use(self) -> CheckpointConfig:
        if self.local_path is not None and not (self.sagemaker_sync or self.marker):
            raise ValueError(
                "local_path is the trainer's checkpoint directory: set marker (Aerie uploads what the trainer "
                "writes there) or sagemaker_sync: true (SageMaker's own sync) with it"
            )
        return self


class MetricsConfig(_Strict):
    """Progress of a trainer that does not write Aerie's metrics stream: from its output lines (a
    preset for its format and/or SageMaker-shaped `MetricDefinitions`, agent/logparse.py) and/or
    from its TensorBoard event files (`tensorboard`: `true`, a directory, or `{dir, tags, flush_s}`;
    agent/tb_progress.py). `metrics: hf-trainer`, `metrics: tensorboard` and
    `metrics: [{Name, Regex}, ...]` are accepted as short forms."""

    preset: Literal["megatron", "hf-trainer", "torchtitan", "lightning"] | None = None
    definitions: list[dict[str, str]] = Field(default_factory=list)
    tensorboard: dict[str, Any] | None = None

    @model_validator(mode="before")
    @classmethod
    def _short_forms(cls, value: Any) -> Any:
        if value == byo.SOURCE_TENSORBOARD:
            return {"tensorboard": {}}
        if isinstance(value, str):
            return {"preset": value}
        if isinstance(value, list):
            return {"definitions": value}
        return value

    @field_validator("definitions")
    @classmethod
    def _valid_definitions(cls, value: list[dict[str, str]]) -> list[dict[str, str]]:
        return byo.validate_definitions(value)

    @field_validator("tensorboard", mode="before")
    @classmethod
    def _valid_tensorboard(cls, value: Any) -> dict[str, Any] | None:
        if value is None or value is False:
            return None
        return byo.validate_tensorboard(value)

    @model_validator(mode="after")
    def _something(self) -> MetricsConfig:
        if self.preset is None and not self.definitions and self.tensorboard is None:
            raise ValueError(
                f"give a preset ({', '.join(byo.PRESETS)}), definitions [{{Name, Regex}}] or tensorboard: true"
            )
        return self


class RetryConfig(_Strict):
    max_restarts: int = Field(default=3, ge=0, le=100)
    exclude_bad_nodes: bool = True
    # A node is left out of the job's next attempts once it has been blamed this many times (blame
    # comes from evidence, recovery/blame.py; a failed pre-flight check is one, naming its node).
    exclude_after_blames: int = Field(default=1, ge=1, le=100)
    # Exit codes that mean "the user's code or input is wrong": retrying cannot help.
    non_retryable_exit_codes: list[int] = Field(default_factory=lambda: [2])
    # Consecutive restarts in place (the same nodes, the agents kept up, only the worker groups
    # restarted) before the next restart relaunches the attempt from nothing; 0: always relaunch.
    # Node loss or a blamed node relaunches whatever is left (aerie_contracts.restarts).
    in_place_restarts: int = Field(default=DEFAULT_IN_PLACE_RESTARTS, ge=0, le=100)


def _model_of(settings: type[DataclassInstance], base: type[BaseModel]) -> type[BaseModel]:
    """A strict pydantic model generated from a contracts dataclass: same fields, defaults and
    bounds, so the spec and the agent read one definition (`aerie_contracts.health`)."""
    hints = typing.get_type_hints(settings)
    fields: dict[str, Any] = {}
    for f in dataclasses.fields(settings):
        tp = hints[f.name]
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            model = _model_of(tp, base)
            fields[f.name] = (model, Field(default_factory=model, description=f.metadata.get("doc")))
        else:
            # one keyword dict: Field's overloads cannot take the bounds as a **dict[str, float]
            options: dict[str, Any] = {"description": f.metadata.get("doc"), **field_bounds(f)}
            fields[f.name] = (tp, Field(default=f.default, **options))
    return create_model(
        settings.__name__.replace("Settings", "Config"), __base__=base, __doc__=settings.__doc__, **fields
    )


if TYPE_CHECKING:
    # What mypy sees of the model generated below, as it cannot see a class made at run time: a
    # strict model. (Its fields are HealthSettings'; the spec only passes them on, as JSON.)
    class HealthConfig(_Strict): ...

else:
    HealthConfig = _model_of(HealthSettings, _Strict)


class SamplingConfig(_Strict):
    """How eval answers are sampled from a checkpoint (trainer/generate.py)."""

    max_new_tokens: int = Field(default=64, ge=1, le=4096)
    temperature: float = Field(default=0.8, ge=0, le=5)
    top_k: int = Field(default=50, ge=0)
    seed: int = 0


class EvalConfig(_Strict):
    """Human eval in Slack: each chosen good checkpoint's answers are posted for people to rate.

    Which checkpoints: every `every_n_checkpoints`-th good one, or (instead) the first good one
    after each firing of `schedule`, a 5-field cron expression ("0 */6 * * *", UTC). Neither: all.
    """

    schedule: str | None = None
    every_n_checkpoints: int | None = Field(default=None, ge=1)
    prompts: list[str] = Field(default_factory=list)
    prompts_file: str | None = None  # one prompt per line, or a JSON list; relative to the workdir
    slack_channel: str | None = None
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    raters_needed: int = Field(default=3, ge=1, le=100)

    @field_validator("schedule")
    @classmethod
    def _cron(cls, value: str | None) -> str | None:
        if value is not None:
            from lambdas.cron import parse_cron

            parse_cron(value)  # raises ValueError naming the bad field
        return value

    @field_validator("every_n_checkpoints")
    @classmethod
    def _one_rule(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value is not None and info.data.get("schedule"):
            raise ValueError("give either schedule or every_n_checkpoints, not both")
        return value


class JobSpec(_Strict):
    name: str = Field(pattern=NAME_PATTERN)
    image: str = "aerie/trainer:latest"
    entrypoint: list[str] = Field(min_length=1)
    args: list[str] = Field(default_factory=list)
    hyperparameters: dict[str, str] = Field(default_factory=dict)
    inputs: list[InputChannel] = Field(default_factory=list)
    output: OutputConfig = Field(default_factory=OutputConfig)
    resources: Resources = Field(default_factory=Resources)
    stopping: Stopping = Field(default_factory=Stopping)
    checkpoint: CheckpointConfig | None = None
    retry: RetryConfig = Field(default_factory=RetryConfig)
    env: dict[str, str] = Field(default_factory=dict)
    tags: dict[str, str] = Field(default_factory=dict)
    health: HealthConfig = Field(default_factory=HealthConfig)
    eval: EvalConfig | None = None
    metrics: MetricsConfig | None = None
    backend: Literal["local", "slurm", "sagemaker"] = "local"
    backend_options: dict[str, Any] = Field(default_factory=dict)

    @field_validator("hyperparameters", mode="before")
    @classmethod
    def _stringify_hyperparameters(cls, value: Any) -> Any:
        # SageMaker hyperparameters are strings; YAML users write numbers. Accept both.
        if isinstance(value, dict):
            return {str(k): v if isinstance(v, str) else json.dumps(v) for k, v in value.items()}
        return value

    @field_validator("hyperparameters")
    @classmethod
    def _at_most_100(cls, value: dict[str, str]) -> dict[str, str]:
        if len(value) > 100:
            raise ValueError(f"at most 100 hyperparameters (SageMaker's limit), got {len(value)}")
        return value

    @model_validator(mode="after")
    def _node_slots(self) -> JobSpec:
        if self.backend == "local":  # the local backend's node pool (other backends have their own)
            from orchestrator.placement import node_slots

            node_slots(self.backend_options, self.resources.instance_count, self.resources.spare_nodes)
        return self

    @field_validator("inputs")
    @classmethod
    def _unique_channels(cls, value: list[InputChannel]) -> list[InputChannel]:
        names = [c.channel for c in value]
        if len(names) != len(set(names)):
            raise ValueError("input channel names must be unique")
        return value

    @model_validator(mode="after")
    def _pipe_on_sagemaker_only(self) -> JobSpec:
        piped = [c.channel for c in self.inputs if c.mode == "Pipe"]
        if piped and self.backend != "sagemaker":
            raise ValueError(
                f"inputs {piped}: Pipe mode is SageMaker's own; on the {self.backend} backend use File or FastFile"
            )
        return self

    # --- loading -------------------------------------------------------------------------------

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JobSpec:
        """Validate a spec (a raw CreateTrainingJob request: `sagemaker_mapping.spec_from_document`)."""
        return cls.model_validate(data)

    @classmethod
    def load(cls, path: str | Path) -> JobSpec:
        return cls.from_dict(load_document(Path(path)))


def load_document(path: Path) -> dict[str, Any]:
    """Read a YAML or JSON document (JSON is YAML) into a dict, with a clear error otherwise."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise SpecError(f"cannot read {path}: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SpecError(f"{path} is not valid YAML/JSON: {exc}") from None
    if not isinstance(data, dict):
        raise SpecError(f"{path} must hold a mapping (a job spec), not {type(data).__name__}")
    return data


class SpecError(ValueError):
    """A spec that cannot be used; the message names every problem."""


def format_validation_error(exc: ValidationError) -> str:
    """One line per bad field, e.g. `resources.instance_count: Input should be >= 1`."""
    lines = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "(spec)"
        lines.append(f"{loc}: {err['msg']}")
    return "\n".join(lines)
