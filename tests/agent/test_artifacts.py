"""The model upload SageMaker does after a clean run, done by the first node's agent
(agent/artifacts.py), against the loopback S3 server (moto)."""

from __future__ import annotations

import io
import tarfile

import boto3
import pytest

from agent.artifacts import upload_model


def test_the_model_directory_becomes_model_tar_gz_with_its_contents_at_the_root(s3_bucket, tmp_path):
    model = tmp_path / "model"
    (model / "sub").mkdir(parents=True)
    (model / "config.json").write_text("{}")
    (model / "sub" / "weights.bin").write_bytes(b"\0" * 10)
    uri = f"s3://{s3_bucket}/out/job-1/output/model.tar.gz"
    size = upload_model(model, uri)
    body = boto3.client("s3").get_object(Bucket=s3_bucket, Key="out/job-1/output/model.tar.gz")["Body"].read()
    assert len(body) == size
    with tarfile.open(fileobj=io.BytesIO(body)) as tar:
        assert sorted(tar.getnames()) == ["config.json", "sub", "sub/weights.bin"]


def test_an_empty_model_directory_is_an_empty_archive_and_a_bad_uri_an_error(s3_bucket, tmp_path):
    assert upload_model(tmp_path / "none", f"s3://{s3_bucket}/m.tar.gz") > 0
    with pytest.raises(ValueError, match="not an S3 object URI"):
        upload_model(tmp_path, "s3://bucket-only")
