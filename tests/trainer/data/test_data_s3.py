"""The data path without a shared filesystem: `aerie data preprocess --output-prefix s3://...`
streams a dataset to the loopback S3 server, and the trainer's readers take it back, from a
channel directory (File) or straight from S3 (FastFile) with a read-ahead; requests counted at
the server."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from aerie_s3.clients import boto3_client
from trainer.data import GPTDataset, IndexedDataset, MegatronPretrainingSampler, preprocess
from trainer.data.channels import resolve
from trainer.data.cli import data_app
from trainer.data.preprocess_data import PreprocessError
from trainer.data.readahead import _ReadAhead, read_ahead
from trainer.data.s3_indexed import S3IndexedDataset


@pytest.fixture(scope="module")
def bucket(counting_s3):
    with pytest.MonkeyPatch.context() as mp:
        yield counting_s3.fresh_bucket(mp.setenv)


@pytest.fixture(scope="module")
def s3_dataset(bucket, corpus, tokenizer_path):
    """The corpus preprocessed by the real CLI command straight to S3."""
    result = CliRunner().invoke(
        data_app,
        [
            "preprocess",
            "--input",
            str(corpus),
            "--tokenizer",
            str(tokenizer_path),
            "--output-prefix",
            f"s3://{bucket}/data/corpus",
            "--append-eod",
            "--workers",
            "2",
            "--no-progress",
        ],
    )
    assert result.exit_code == 0, result.output
    stats = json.loads(result.output.strip().splitlines()[-1])
    assert stats["output_prefix"] == f"s3://{bucket}/data/corpus_text_document"
    return stats["output_prefix"]


def test_preprocess_to_s3_writes_the_same_bytes_as_to_disk(s3_dataset, dataset_prefix, bucket):
    s3 = boto3_client()
    for ext in (".bin", ".idx"):
        body = s3.get_object(Bucket=bucket, Key=f"data/corpus_text_document{ext}")["Body"].read()
        assert body == open(dataset_prefix + ext, "rb").read()
    remote, local = S3IndexedDataset(s3_dataset), IndexedDataset(dataset_prefix)
    assert len(remote) == len(local) and remote.dtype is local.dtype
    assert all(np.array_equal(remote[i], local[i]) for i in range(len(local)))


def test_a_failed_preprocess_leaves_no_object_behind(bucket, tmp_path, tokenizer_path):
    src = tmp_path / "docs.jsonl"
    src.write_text(json.dumps({"text": "fine " * 200000}) + "\n" + "{broken\n")
    with pytest.raises(PreprocessError, match="not valid JSON"):
        preprocess(src, "text", tokenizer_path, f"s3://{bucket}/bad/x", progress=False)
    s3 = boto3_client()
    assert "Contents" not in s3.list_objects_v2(Bucket=bucket, Prefix="bad/")
    assert not s3.list_multipart_uploads(Bucket=bucket).get("Uploads")
    with pytest.raises(PreprocessError, match=r"NoSuchBucket|404"):
        preprocess(src, "text", tokenizer_path, f"s3://no-such-bucket-{bucket}/x", progress=False)


def test_fastfile_batches_equal_file_batches_and_come_from_the_read_ahead(
    s3_dataset, dataset_prefix, counting_s3, bucket, tmp_path
):
    seq_len, samples, mbs = 32, 400, 4
    local = GPTDataset(dataset_prefix, seq_len, samples, seed=7, cache_dir=tmp_path / "idx-local")
    remote = GPTDataset(s3_dataset, seq_len, samples, seed=7, cache_dir=tmp_path / "idx-remote")
    assert remote.streaming and not local.streaming

    def batches(dataset, window):
        sampler = MegatronPretrainingSampler(samples, 40, mbs, data_parallel_rank=1, data_parallel_size=2)
        return [np.stack(b) for b in read_ahead(dataset, sampler, window)]

    expected = batches(local, 1 << 20)
    mark = counting_s3.mark()
    got = batches(remote, 64 * 1024)  # a small window: many chunks, released as they are consumed
    assert len(got) == len(expected) == (samples - 40) // (mbs * 2)
    assert all(np.array_equal(a, b) for a, b in zip(got, expected))
    ds = remote.datasets[0].dataset
    assert ds.misses == 0 and ds.store.held_bytes == 0
    gets = counting_s3.object_gets(bucket, mark)
    assert set(gets) == {"data/corpus_text_document.bin"}
    # Ranges merged: far fewer GETs than samples read.
    assert gets["data/corpus_text_document.bin"] < len(got) * mbs / 2


def test_read_ahead_left_early_releases_what_it_holds(s3_dataset, tmp_path):
    remote = GPTDataset(s3_dataset, 32, 200, seed=1, cache_dir=tmp_path / "idx")
    sampler = MegatronPretrainingSampler(200, 0, 2, 0, 1)
    it = iter(_ReadAhead(remote, sampler, 32 * 1024, None))
    next(it)
    it.close()
    ds = remote.datasets[0].dataset
    import time

    deadline = time.time() + 10
    while ds.store.held_bytes and time.time() < deadline:
        time.sleep(0.05)
    assert ds.store.held_bytes == 0


def test_a_channel_resolves_to_its_directory_or_to_s3_in_fastfile_mode(s3_dataset, bucket, tmp_path):
    config = tmp_path / "input" / "config"
    config.mkdir(parents=True)
    env = {
        "AERIE_ML_ROOT": str(tmp_path),
        "SM_CHANNEL_TRAIN": str(tmp_path / "input" / "data" / "train"),
        "SM_CHANNEL_TRAIN_S3_URI": f"s3://{bucket}/data",
    }
    (config / "inputdataconfig.json").write_text(json.dumps({"train": {"TrainingInputMode": "File"}}))
    assert resolve("train", "corpus_text_document", env) == str(tmp_path / "input/data/train/corpus_text_document")
    (config / "inputdataconfig.json").write_text(json.dumps({"train": {"TrainingInputMode": "FastFile"}}))
    assert resolve("train", "corpus_text_document", env) == s3_dataset  # data/ is a folder
    env["SM_CHANNEL_TRAIN_S3_URI"] = f"s3://{bucket}/data/corpus"  # a prefix ending inside a name
    assert resolve("train", "corpus_text_document", env) == s3_dataset
    with pytest.raises(ValueError, match="no such input channel"):
        resolve("eval", "x", env)
    # SageMaker: no SM_* variables (no training toolkit in the image), only the contract's files.
    (config / "inputdataconfig.json").write_text(json.dumps({"train": {"TrainingInputMode": "File"}}))
    sagemaker = {"AERIE_ML_ROOT": str(tmp_path)}
    assert resolve("train", "c", sagemaker) == str(tmp_path / "input" / "data" / "train" / "c")


def test_read_ahead_joins_ranges_without_multiplying_the_bytes():
    from trainer.data.readahead import merge

    assert merge([(10_000, 100), (0, 100), (150, 100)]) == [(0, 250), (10_000, 10_100)]
    assert merge([(0, 10_000), (15_000, 10_000)]) == [(0, 25_000)]  # the gap is smaller than the range
    spread = [(i * 1_000_000, 300) for i in range(100)]  # samples far apart in a large dataset
    assert merge(spread) == [(lo, lo + 300) for lo, _ in spread]
