"""The variables the agent gives its ranks: the SageMaker training toolkit's `SM_*`, derived from
the node's identity and the container contract's files (`aerie_contracts.container`), since
SageMaker itself sets none of them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping

from aerie_contracts import env as E
from aerie_contracts.channels import env_name
from aerie_contracts.container import read_json
from agent.devices import visible_gpu_count
from agent.identity import NodeIdentity


def trainer_env(ident: NodeIdentity, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables the agent gives its ranks: the SageMaker training toolkit's `SM_*` (from the
    node's identity and config files) and Aerie's paths, all derived from the ML root."""
    env = os.environ if env is None else env
    root = ident.ml_root
    config = root / "input" / "config"
    hps = read_json(config / "hyperparameters.json", {}) or {}
    channels = sorted(read_json(config / "inputdataconfig.json", {}) or {})
    groups = {g.get("instance_group_name"): g for g in ident.instance_groups}
    out = {
        E.ML_ROOT: str(root),
        E.NODE_DIR: str(ident.node_dir),
        E.METRICS_PATH: env.get(E.METRICS_PATH) or str(ident.metrics_dir),
        "SM_HOSTS": json.dumps(list(ident.hosts)),
        "SM_CURRENT_HOST": ident.current_host,
        "SM_CURRENT_INSTANCE_TYPE": ident.instance_type,
        "SM_CURRENT_INSTANCE_GROUP": ident.group,
        "SM_CURRENT_INSTANCE_GROUP_HOSTS": json.dumps(ident.group_hosts),
        "SM_INSTANCE_GROUPS": json.dumps(list(groups) or [ident.group]),
        "SM_INSTANCE_GROUPS_DICT": json.dumps(groups),
        "SM_IS_HETERO": json.dumps(len(groups) > 1),
        "SM_NETWORK_INTERFACE_NAME": ident.network_interface,
        "SM_RESOURCE_CONFIG": json.dumps(ident.resource_config()),
        "SM_NUM_GPUS": str(visible_gpu_count(env)),
        "SM_NUM_CPUS": str(os.cpu_count() or 1),
        "SM_HPS": json.dumps(hps),
        "SM_MODEL_DIR": str(root / "model"),
        "SM_OUTPUT_DIR": str(root / "output"),
        "SM_OUTPUT_DATA_DIR": str(root / "output"),
        "SM_INPUT_DIR": str(root / "input"),
        "SM_INPUT_CONFIG_DIR": str(config),
        "SM_CHANNELS": json.dumps(channels),
    }
    for name in channels:
        out[f"SM_CHANNEL_{env_name(name)}"] = str(root / "input" / "data" / name)
    return out
