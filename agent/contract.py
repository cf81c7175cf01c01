"""The SageMaker training-container contract, built for one node.

The same layout under `/opt/ml` (a container) or any directory (`AERIE_ML_ROOT`, the local and
Slurm backends), so a container built for SageMaker runs unchanged on every backend. Used by the
backends that lay out nodes themselves and by the agent when it builds its own (Slurm).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class NodeContract:
    ml_root: Path
    hosts: tuple[str, ...]
    current_host: str
    hyperparameters: dict[str, str] = field(default_factory=dict)
    channels: dict[str, str] = field(default_factory=dict)  # channel -> local dir or URI
    network_interface: str = "lo"
    num_gpus: int = 0

    @property
    def node_rank(self) -> int:
        return self.hosts.index(self.current_host)

    @property
    def node_dir(self) -> Path:
        return self.ml_root / "agent"

    @property
    def metrics_dir(self) -> Path:
        return self.ml_root / "output" / "metrics"

    def write(self) -> None:
        """Create the directory tree and the two config files the contract promises."""
        config = self.ml_root / "input" / "config"
        for d in (config, self.ml_root / "model", self.ml_root / "output", self.metrics_dir,
                  self.ml_root / "output" / "tensorboard", self.node_dir / "ranks", self.ml_root / "logs",
                  self.ml_root / "checkpoints"):
            d.mkdir(parents=True, exist_ok=True)
        for name in self.channels:
            (self.ml_root / "input" / "data" / name).mkdir(parents=True, exist_ok=True)
        _write_json(config / "hyperparameters.json", self.hyperparameters)
        _write_json(config / "resourceconfig.json", {
            "current_host": self.current_host,
            "current_instance_type": "local",
            "hosts": list(self.hosts),
            "network_interface_name": self.network_interface,
        })
        _write_json(config / "inputdataconfig.json", {
            name: {"TrainingInputMode": "File", "S3DistributionType": "FullyReplicated"} for name in self.channels
        })

    def env(self) -> dict[str, str]:
        """The SM_* variables SageMaker sets, plus Aerie's paths."""
        env = {
            "AERIE_ML_ROOT": str(self.ml_root),
            "AERIE_NODE_DIR": str(self.node_dir),
            "AERIE_METRICS_PATH": str(self.metrics_dir),
            "SM_HOSTS": json.dumps(list(self.hosts)),
            "SM_CURRENT_HOST": self.current_host,
            "SM_NUM_GPUS": str(self.num_gpus),
            "SM_HPS": json.dumps(self.hyperparameters),
            "SM_MODEL_DIR": str(self.ml_root / "model"),
            "SM_OUTPUT_DATA_DIR": str(self.ml_root / "output"),
            "SM_INPUT_DIR": str(self.ml_root / "input"),
            "SM_INPUT_CONFIG_DIR": str(self.ml_root / "input" / "config"),
            "SM_NETWORK_INTERFACE_NAME": self.network_interface,
            "SM_CHANNELS": json.dumps(sorted(self.channels)),
        }
        for name in self.channels:
            env[f"SM_CHANNEL_{_env_name(name)}"] = str(self.ml_root / "input" / "data" / name)
        return env


def _env_name(channel: str) -> str:
    return re.sub(r"[^A-Za-z0-9]", "_", channel).upper()


def _write_json(path: Path, data: object) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2))
    os.replace(tmp, path)


def read_json(path: Path, default: object = None) -> object:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return default


write_json = _write_json
