"""SageMaker's last step of a successful job: the model directory uploaded as `model.tar.gz`.

On SageMaker the platform tars `/opt/ml/model` and puts it at `<S3OutputPath>/<job>/output/
model.tar.gz` (what DescribeTrainingJob's `ModelArtifacts` names). On Aerie's own backends the
agent of the first host does it, when the control plane asked for it (`AERIE_MODEL_ARTIFACTS_URI`,
set for jobs created through the SageMaker-compatible endpoint), after every rank exited 0.
S3 is reached as the node reaches it for checkpoints (`AERIE_S3_ENDPOINT` or the AWS_* variables).
"""

from __future__ import annotations

import os
import tarfile
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from aerie_contracts import env


def s3_client() -> Any:
    import boto3
    from botocore.config import Config

    endpoint = os.environ.get(env.S3_ENDPOINT) or os.environ.get("AWS_ENDPOINT_URL") or None
    return boto3.client(
        "s3", endpoint_url=endpoint, config=Config(s3={"addressing_style": "path"}) if endpoint else None
    )


def upload_model(model_dir: Path, uri: str, client: Any = None) -> int:
    """Tar+gzip `model_dir` (its contents at the archive's root, as SageMaker does) to `uri`.
    Returns the archive's size in bytes."""
    parts = urlsplit(uri)
    if parts.scheme != "s3" or not parts.netloc or not parts.path.strip("/"):
        raise ValueError(f"not an S3 object URI: {uri!r}")
    with tempfile.TemporaryDirectory(prefix="aerie-model-") as tmp:
        archive = Path(tmp) / "model.tar.gz"
        with tarfile.open(archive, "w:gz") as tar:
            if model_dir.is_dir():
                for child in sorted(model_dir.iterdir()):
                    tar.add(child, arcname=child.name)
        (client or s3_client()).upload_file(str(archive), parts.netloc, parts.path.lstrip("/"))
        return archive.stat().st_size
