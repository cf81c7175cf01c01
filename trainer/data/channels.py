"""Where the trainer reads a job's input channel from: its directory, or S3 in FastFile mode.

`data.channel: train` + `prefix: corpus_text_document` names a dataset inside the job's `train`
channel. In File mode (and on SageMaker, whose FastFile mount is a directory too) that is
`$SM_CHANNEL_TRAIN/corpus_text_document`; in Aerie's FastFile mode on the local and Slurm
backends it is streamed from `$SM_CHANNEL_TRAIN_S3_URI` (an Aerie addition) by
`trainer.data.s3_indexed`. A relative path inside the channel maps to the same key either way.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

from aerie_contracts import env as aerie_env
from aerie_contracts.channels import FAST_FILE, S3_URI_SUFFIX, env_name


def _input_config(env: Mapping[str, str]) -> dict:
    path = Path(env.get(aerie_env.ML_ROOT, "/opt/ml")) / "input" / "config" / "inputdataconfig.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def channel_mode(name: str, env: Mapping[str, str] | None = None) -> str:
    env = os.environ if env is None else env
    return (_input_config(env).get(name) or {}).get("TrainingInputMode") or "File"


def resolve(channel: str, relative: str, env: Mapping[str, str] | None = None) -> str:
    """The dataset prefix `relative` of `channel`: a local path, or an `s3://` URI (FastFile)."""
    env = os.environ if env is None else env
    var = f"SM_CHANNEL_{env_name(channel)}"
    uri = env.get(var + S3_URI_SUFFIX)
    if uri and channel_mode(channel, env) == FAST_FILE:
        return _s3_join(uri, relative)
    if var in env:
        return str(Path(env[var]) / relative)
    # On SageMaker itself only the files exist (no SM_* without its training toolkit).
    config = _input_config(env)
    if channel in config:
        return str(Path(env.get(aerie_env.ML_ROOT, "/opt/ml")) / "input" / "data" / channel / relative)
    raise ValueError(
        f"data.channel {channel!r}: the job has no such input channel ({var} is not set; "
        f"inputdataconfig.json lists {sorted(config)})"
    )


def _s3_join(uri: str, relative: str) -> str:
    """The key the agent would have placed at `relative` (agent.channels.relative_path's inverse):
    below the prefix as a folder, or, for a prefix ending inside a name, beside it."""
    relative = relative.lstrip("/")
    if uri.endswith("/"):
        return uri + relative
    folder = f"{uri}/{relative}"
    beside = uri[: uri.rfind("/") + 1] + relative
    if folder == beside:
        return folder
    from trainer.data.s3_indexed import S3IndexedDataset

    return folder if S3IndexedDataset.exists(folder) or not S3IndexedDataset.exists(beside) else beside
