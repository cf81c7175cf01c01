"""The SageMaker training-container contract: a node's `/opt/ml` layout and the files in it.

The same layout under `/opt/ml` (a container) or any directory (`AERIE_ML_ROOT`, the local and
Slurm backends), so a container built for SageMaker runs unchanged on every backend. Backends that
lay out nodes themselves write it (`NodeContract`); the agent reads the node's identity from it
(`agent.identity`) and gives the ranks the `SM_*` variables the SageMaker training toolkit would
(`agent.toolkit_env`), since SageMaker itself sets none of them. Standard library only.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aerie_contracts import env as E
from aerie_contracts.channels import FILE, FULLY_REPLICATED, S3_URI_SUFFIX, env_name
from aerie_contracts.failures import FailureKind

DEFAULT_ML_ROOT = Path("/opt/ml")
RESOURCE_CONFIG = Path("input") / "config" / "resourceconfig.json"
DEFAULT_GROUP = "homogeneousCluster"  # SageMaker's group name when the job has no instance groups

# --- input channels (InputDataConfig), with SageMaker's names ---------------------------------
# The channels' modes, distributions and SM_CHANNEL_* names: aerie_contracts.channels.
# The per-host cache of File-mode downloads (keyed by object ETag; see agent/channel_cache.py).
CHANNEL_CACHE_ENV = E.CHANNEL_CACHE
DEFAULT_CHANNEL_CACHE = "/var/tmp/aerie/channel-cache"
# A channel that cannot arrive (missing prefix, access denied, checksum mismatch): the job's input
# is wrong, so the attempt fails before any rank starts and is not retried (lambdas/chain_restart.py).
INPUT_UNAVAILABLE = FailureKind.INPUT_UNAVAILABLE.value
# The heartbeat phase (aerie_contracts.sagemaker_api.PHASE) of a node while its channels download;
# the download's totals are in agent/data_download.json (agent.channels.write_record).
PHASE_DATA_DOWNLOAD = "data_download"


class NodeLayout:
    """Where a node's files lie under its ML root: the agent's own, and the ranks' metrics streams."""

    ml_root: Path

    @property
    def node_dir(self) -> Path:
        return self.ml_root / "agent"

    @property
    def metrics_dir(self) -> Path:
        return self.ml_root / "output" / "metrics"


def resource_config(
    current_host: str,
    hosts: tuple[str, ...] | list[str],
    instance_type: str = "local",
    network_interface: str = "lo",
    group: str = DEFAULT_GROUP,
    instance_groups: tuple[dict[str, Any], ...] | list[dict[str, Any]] = (),
) -> dict[str, Any]:
    """SageMaker's resourceconfig.json layout (one homogeneous group unless groups are given)."""
    groups = list(instance_groups) or [
        {"instance_group_name": group, "instance_type": instance_type, "hosts": list(hosts)}
    ]
    return {
        "current_host": current_host,
        "current_instance_type": instance_type,
        "current_group_name": group,
        "hosts": list(hosts),
        "instance_groups": [dict(g) for g in groups],
        "network_interface_name": network_interface,
    }


def node_path(path: str, ml_root: Path) -> Path:
    """Where a SageMaker container path is on this node: /opt/ml paths under the node's ML root (the
    local and Slurm backends root /opt/ml there), other absolute paths as given."""
    if path == "/opt/ml":
        return Path(ml_root)
    if path.startswith("/opt/ml/"):
        return Path(ml_root) / path[len("/opt/ml/") :]
    return Path(path)


def channel_config(value: Any) -> dict[str, str]:
    """A channel as the backend describes it: a URI, or {"s3_uri", "mode", "distribution"}."""
    if isinstance(value, str):
        value = {"s3_uri": value}
    return {
        "s3_uri": str(value.get("s3_uri") or ""),
        "mode": str(value.get("mode") or FILE),
        "distribution": str(value.get("distribution") or FULLY_REPLICATED),
    }


def local_source(uri: str) -> Path | None:
    """The directory or file of a `file://` or absolute-path channel, else None (an S3 channel)."""
    if uri.startswith("file://"):
        return Path(uri[len("file://") :])
    return Path(uri) if uri.startswith("/") else None


@dataclass(frozen=True)
class NodeContract(NodeLayout):
    ml_root: Path
    hosts: tuple[str, ...]
    current_host: str
    hyperparameters: dict[str, str] = field(default_factory=dict)
    # channel -> its URI (s3://, file://, /path), or {"s3_uri", "mode", "distribution"}
    channels: dict[str, Any] = field(default_factory=dict)
    network_interface: str = "lo"
    instance_type: str = "local"
    group: str = DEFAULT_GROUP

    @property
    def node_rank(self) -> int:
        return sorted(self.hosts).index(self.current_host)

    def write(self) -> None:
        """Create the directory tree and the config files SageMaker writes before the container starts."""
        config = self.ml_root / "input" / "config"
        for d in (
            config,
            self.ml_root / "model",
            self.ml_root / "output",
            self.metrics_dir,
            self.ml_root / "output" / "tensorboard",
            self.node_dir / "ranks",
            self.ml_root / "logs",
            self.ml_root / "checkpoints",
        ):
            d.mkdir(parents=True, exist_ok=True)
        for name, value in self.channels.items():
            self._channel_dir(name, channel_config(value)["s3_uri"])
        write_json(config / "hyperparameters.json", self.hyperparameters)
        rc = resource_config(
            self.current_host, sorted(self.hosts), self.instance_type, self.network_interface, self.group
        )
        write_json(config / "resourceconfig.json", rc)
        write_json(
            config / "inputdataconfig.json",
            {
                name: {
                    "TrainingInputMode": cfg["mode"],
                    "S3DistributionType": cfg["distribution"],
                    "RecordWrapperType": "None",
                }
                for name, cfg in ((n, channel_config(v)) for n, v in self.channels.items())
            },
        )

    def _channel_dir(self, name: str, uri: str) -> None:
        """An S3 channel's directory starts empty (the agent fills a File-mode one); a local
        source (file://, /path) is linked in place, as a file system data source is mounted."""
        path = self.ml_root / "input" / "data" / name
        source = local_source(uri)
        if source is None or path.is_symlink():
            path.mkdir(parents=True, exist_ok=True)
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            if path.is_dir() and not any(path.iterdir()):
                path.rmdir()
            if not path.exists():
                path.symlink_to(source, target_is_directory=True)
            return
        path.mkdir(parents=True, exist_ok=True)
        link = path / source.name
        if not link.exists() and not link.is_symlink():
            link.symlink_to(source)

    def env(self) -> dict[str, str]:
        """What a backend gives the node besides the files: where its /opt/ml is. Everything else
        (identity, SM_*, the agent's directory) the agent derives, as it must on SageMaker."""
        env: dict[str, str] = {E.ML_ROOT: str(self.ml_root)}
        # Aerie's addition: an S3 channel's URI, which SageMaker's files do not carry (SageMaker
        # downloads channels itself; on other backends the agent does, from this URI).
        for name, value in self.channels.items():
            uri = channel_config(value)["s3_uri"]
            if uri.startswith("s3://"):
                env[f"SM_CHANNEL_{env_name(name)}{S3_URI_SUFFIX}"] = uri
        return env


def write_json(path: Path, data: object) -> None:
    """Atomically: readers see the old file or the new one. The temporary name is the writer's own
    (pid, thread): several processes may write one file at once (every node of a Slurm allocation
    records `hosts.json`), and with one shared name a writer's rename took another's file away
    (FileNotFoundError in the node's bootstrap)."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}-{threading.get_ident()}.tmp")
    tmp.write_text(json.dumps(data, indent=2))
    os.replace(tmp, path)


def read_json(path: Path, default: Any = None) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return default
