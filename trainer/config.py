"""The training run's configuration: one YAML file, then overrides, validated by pydantic.

Precedence, lowest to highest:
1. the YAML file given with `--config` (a relative path resolves against `AERIE_WORKDIR`, else
   the current directory);
2. SageMaker hyperparameters: `SM_HPS` (JSON) or else `$AERIE_ML_ROOT/input/config/hyperparameters.json`.
   Keys are dotted config paths (`lr`, `model.overrides.num_layers`, `checkpoint.every_steps`);
   values arrive as strings and are coerced. Keys that are not config paths (`sagemaker_*`, or
   hyperparameters meant for something else) are ignored with a warning, since a job spec's
   hyperparameters are not all the trainer's;
3. `--set key=value` on the command line (an unknown key is an error: it is a typo).

Relative data paths in the config resolve against the same base directory as `--config`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from aerie_contracts import env

log = logging.getLogger(__name__)


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class ModelSection(_Section):
    preset: str = "pythia-tiny"
    overrides: dict[str, Any] = Field(default_factory=dict)  # ModelConfig fields, e.g. num_layers


class DataSection(_Section):
    """Either `prefixes` (or one `prefix`; + `weights`, and `tokenizer` for the vocabulary size)
    or `corpus: stdlib`.

    `corpus: stdlib` builds, on first use, a byte-level BPE tokenizer (`vocab_size`) and a
    preprocessed `.bin/.idx` of the Python standard library's sources (capped at `max_bytes`)
    in `cache_dir`; the local rank 0 of every node builds it, the others wait.

    `channel: train` reads the prefixes from the job's input channel `train` (relative to it):
    its directory in File mode, streamed from S3 in FastFile mode (`trainer.data.channels`), with
    `read_ahead_mb` of the next micro-batches' bytes fetched ahead per rank.
    """

    corpus: Literal["stdlib"] | None = None
    channel: str | None = None
    prefix: str | None = None
    prefixes: list[str] = Field(default_factory=list)
    weights: list[float] | None = None
    tokenizer: str | None = None
    cache_dir: str | None = None  # default: $AERIE_DATA_CACHE or ~/.cache/aerie/data
    vocab_size: int = 512
    max_bytes: int | None = 4_000_000
    workers: int = 1
    read_ahead_mb: float = Field(default=64.0, gt=0)

    @model_validator(mode="after")
    def _one_source(self) -> DataSection:
        if self.prefix is not None:
            if self.prefixes:
                raise ValueError("give `prefix` or `prefixes`, not both")
            self.prefixes = [self.prefix]
        if (self.corpus is None) == (not self.prefixes):
            raise ValueError("data needs exactly one of `corpus: stdlib` or `prefixes` (or `prefix`)")
        if self.channel is not None and self.corpus is not None:
            raise ValueError("`channel` reads prefixes from an input channel: give `prefix`, not `corpus`")
        if self.weights is not None and len(self.weights) != len(self.prefixes):
            raise ValueError(f"{len(self.weights)} weights for {len(self.prefixes)} prefixes")
        return self


class CheckpointSection(_Section):
    """Where and how often. `uri` defaults to `AERIE_CHECKPOINT_URI` (empty: no checkpoints);
    `every_steps` to `AERIE_CHECKPOINT_EVERY` (the spec's `checkpoint.every_steps`), else 0 (never).
    `auto`: the Young–Daly interval from the run's own measured save stall and step time and the
    MTBF the control plane passes (trainer/checkpoint/interval.py), the first save at step
    `auto_first_steps`."""

    uri: str | None = None
    every_steps: int | Literal["auto"] | None = None
    auto_first_steps: int = Field(100, ge=1)
    async_save: bool = Field(True, alias="async")
    thread_count: int = 4  # parallel writers per rank (S3 uploads, file writes)

    def resolved_uri(self) -> str | None:
        uri = self.uri if self.uri is not None else os.environ.get(env.CHECKPOINT_URI, "")
        return uri or None

    def resolved_every(self) -> int | Literal["auto"]:
        if self.every_steps is not None:
            return self.every_steps
        raw = (os.environ.get(env.CHECKPOINT_EVERY) or "").strip().lower()
        return "auto" if raw == "auto" else int(raw or 0)


class TrainConfig(_Section):
    model: ModelSection = Field(default_factory=ModelSection)
    data: DataSection
    seq_len: int = 128
    micro_batch_size: int = 8
    grad_accum: int = 1
    steps: int = 100
    # AdamW with linear warmup then cosine decay to min_lr at `steps`.
    lr: float = 1e-3
    min_lr: float = 1e-4
    warmup: int = 10
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    clip: float = 1.0  # max global grad norm; 0 disables clipping (the norm is still reported)
    seed: int = 1234
    parallelism: Literal["ddp", "fsdp2"] = "ddp"
    activation_checkpointing: bool = False
    compile: bool = False
    # Mixed precision of the forward pass (weights, gradients and optimizer state stay float32):
    # "auto": bf16 autocast on GPU, none on CPU (float32: bitwise resume parity there);
    # "bf16": bf16 autocast on either (on CPUs with AMX or AVX-512-BF16, the matmuls use them);
    # "fp32": no autocast anywhere.
    precision: Literal["auto", "fp32", "bf16"] = "auto"
    # Deterministic kernels (`torch.use_deterministic_algorithms`, cuBLAS's fixed workspace): on a
    # GPU, a resumed run's steps then match the uninterrupted run's bit for bit (the embedding's
    # backward and some reductions otherwise add in a varying order), at some speed. The CPU
    # kernels used here are deterministic already.
    deterministic: bool = False
    checkpoint: CheckpointSection = Field(default_factory=CheckpointSection)
    eval_every: int = 0  # steps between evaluations; 0: never
    eval_iters: int = 4  # micro-batches per evaluation
    log_every: int = 1  # steps between metrics lines / TensorBoard points
    print_every: int = Field(default=10, ge=0)  # rank 0 prints a progress line every N steps (0: never)
    # Cost and efficiency accounting (see trainer.pricing); None: look up / detect.
    instance_type: str | None = None  # default: $SM_CURRENT_INSTANCE_TYPE (set by SageMaker)
    price_per_hour: float | None = None  # USD per instance-hour
    peak_flops: float | None = None  # per rank's device, FLOP/s

    @model_validator(mode="after")
    def _sane(self) -> TrainConfig:
        for name in ("seq_len", "micro_batch_size", "grad_accum", "steps", "log_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.min_lr > self.lr:
            raise ValueError("min_lr must not exceed lr")
        return self

    def resolved_instance_type(self) -> str | None:
        return self.instance_type or os.environ.get("SM_CURRENT_INSTANCE_TYPE") or None

    def config_hash(self) -> str:
        """A stable hash of everything that shapes the run (recorded in checkpoint manifests)."""
        blob = json.dumps(self.model_dump(mode="json", by_alias=True), sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


# --- loading -----------------------------------------------------------------------------------


def base_dir() -> Path:
    return Path(os.environ.get(env.WORKDIR) or os.getcwd())


def resolve_path(path: str | Path) -> Path:
    p = Path(path).expanduser()
    return p if p.is_absolute() else base_dir() / p


def parse_value(text: Any) -> Any:
    """'3' -> 3, '1e-3' -> 0.001, 'true' -> True, '[1, 2]' -> [1, 2], 'x' -> 'x' (non-strings as they are)."""
    if not isinstance(text, str):
        return text
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    if isinstance(value, str):  # YAML 1.1 reads '1e-3' as a string
        for cast in (int, float):
            try:
                return cast(value)
            except ValueError:
                pass
    return value


def _known_path(keys: list[str]) -> bool:
    """Whether a dotted path names a config field (anything under model.overrides is allowed)."""
    cls: type[BaseModel] | None = TrainConfig
    for i, key in enumerate(keys):
        if cls is None:
            return False
        fields = {name: f for name, f in cls.model_fields.items()}
        fields.update({f.alias: f for f in cls.model_fields.values() if f.alias})
        if key not in fields:
            return False
        if cls is ModelSection and key == "overrides":
            return len(keys) == i + 2
        ann = fields[key].annotation
        cls = ann if isinstance(ann, type) and issubclass(ann, BaseModel) else None
    return True


def apply_override(raw: dict[str, Any], dotted: str, value: Any) -> None:
    node = raw
    *parents, leaf = dotted.split(".")
    for key in parents:
        node = node.setdefault(key, {})
        if not isinstance(node, dict):
            raise ValueError(f"cannot override {dotted}: {key} is not a section")
    node[leaf] = parse_value(value)


def sagemaker_hyperparameters() -> dict[str, Any]:
    """The job spec's hyperparameters as SageMaker hands them to the container."""
    if os.environ.get("SM_HPS"):
        return json.loads(os.environ["SM_HPS"])
    root = os.environ.get(env.ML_ROOT)
    if root:
        path = Path(root) / "input" / "config" / "hyperparameters.json"
        if path.is_file():
            return json.loads(path.read_text())
    return {}


def load_config(
    path: str | Path | None, sets: list[str] | None = None, use_hyperparameters: bool = True
) -> TrainConfig:
    raw: dict[str, Any] = {}
    if path is not None:
        raw = yaml.safe_load(resolve_path(path).read_text()) or {}
    if use_hyperparameters:
        for key, value in sagemaker_hyperparameters().items():
            if _known_path(key.split(".")):
                apply_override(raw, key, value)
            else:
                log.warning("hyperparameter %r is not a trainer config path; ignored", key)
    for item in sets or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--set expects key=value, got {item!r}")
        if not _known_path(key.split(".")):
            raise ValueError(f"--set {key}: no such config field")
        apply_override(raw, key, value)
    model_overrides = raw.get("model", {}).get("overrides", {})
    for key, value in model_overrides.items():
        model_overrides[key] = parse_value(value)
    return TrainConfig.model_validate(raw)
