"""Training data from S3 on the `slurm` backend (issue 20, acceptance 1): a 2-node Slurm job on the
one-host cluster whose `train` channel is a dataset made by `aerie data preprocess --output-prefix
s3://...` and whose `shards` channel is ShardedByS3Key. Each Slurm node (`agent.slurm` builds its
contract) downloads before its rank starts, into the per-host cache the operator configured
(`AERIE_CHANNEL_CACHE`, passed to every node), and the job trains to completion."""

from __future__ import annotations

import json

import pytest

from aerie_contracts import byo
from tests.helpers.data_jobs import SHARDS, STEPS, files, prepare_dataset, submit
from tests.helpers.slurm_plane import slurm_control_plane

# Not timing-sensitive: `make test` runs it with the unit tests, on two workers (tests/conftest.py):
# a 6-step 2 x 1 job with no fault; it asserts files, request counts and steps, no timing.
pytestmark = [pytest.mark.slow, pytest.mark.side_by_side]


@pytest.fixture
def cp(tmp_path, slurm_cluster, counting_s3):
    cache = tmp_path / "node-cache"
    env = {**slurm_cluster, **counting_s3.env(), "OMP_NUM_THREADS": "1", "AERIE_CHANNEL_CACHE": str(cache)}
    with slurm_control_plane(tmp_path / "home", env) as plane:
        yield plane


@pytest.fixture
def bucket(counting_s3, monkeypatch):
    return counting_s3.fresh_bucket(monkeypatch.setenv, "slurm-data")


def test_a_two_node_slurm_job_trains_on_its_s3_channels(cp, bucket, tmp_path, counting_s3):
    dataset = prepare_dataset(cp, bucket, tmp_path)
    mark = counting_s3.mark()
    job = submit(
        cp,
        tmp_path,
        "slurm-data",
        [
            {"channel": "train", "s3_uri": dataset["uri"]},
            {"channel": "shards", "s3_uri": f"s3://{bucket}/shards/", "distribution": "ShardedByS3Key"},
        ],
        dataset["config"],
        backend="slurm",
    )
    assert job["state"] == "Completed", json.dumps(job)[:3000]
    root = cp.home / "jobs" / job["id"] / "attempt-1"
    train = {k.removeprefix("datasets/stdlib/"): v for k, v in dataset["objects"].items()}
    for host, share in (("node1", ["part-0.txt", "part-2.txt"]), ("node2", ["part-1.txt"])):
        data = root / host / "input" / "data"
        assert files(data / "train") == train
        assert files(data / "shards") == {s: SHARDS[f"shards/{s}"] for s in share}
        record = json.loads((root / host / "agent" / "data_download.json").read_text())
        assert record["channels"]["train"]["objects"] == 2
    metrics = (root / "node1" / "output" / "metrics" / "rank-00000.jsonl").read_text().splitlines()
    steps = [json.loads(line) for line in metrics]
    own = [r for r in steps if r.get("event") is None and r.get(byo.SOURCE_KEY) != byo.SOURCE_PROBE]  # the trainer's
    assert [r["step"] for r in own] == list(range(1, STEPS + 1))
    # Both emulated nodes share this host's cache: every object left S3 once.
    gets = counting_s3.object_gets(bucket, mark)
    assert set(gets) == set(dataset["objects"]) | set(SHARDS)
    assert all(gets[k] == 1 for k in SHARDS)
    assert (tmp_path / "node-cache" / "objects").is_dir()
