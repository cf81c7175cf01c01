"""Training data from S3 on the local backend, end to end (issue 20, acceptance 1-4).

A real `aerie up`, the real CLI, agents and torchrun. The dataset is made by the real
`aerie data preprocess --output-prefix s3://...` on the loopback S3 server (a moto server of this
module's own, whose request log counts what reached S3). One File-mode job (2 nodes x 1 rank,
whose first attempt is made to fail at step 2 so the chain relaunches it on the same host), one
FastFile job on the same data, and one job whose channel names a missing prefix.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest

from aerie_s3.ranged import equal_slices
from aerie_s3.settings import S3Settings
from devtools.harness.control_plane import ControlPlane
from devtools.harness.jobs import rank_losses
from tests.helpers.data_jobs import SHARDS, STEPS, prepare_dataset
from tests.helpers.data_jobs import files as _files
from tests.helpers.data_jobs import submit as _submit

# Not timing-sensitive: `make test` runs it with the unit tests, on two workers (tests/conftest.py):
# 6-step jobs whose one fault is an exit; it asserts files, request counts and losses, no timing.
pytestmark = [pytest.mark.slow, pytest.mark.side_by_side]


@pytest.fixture(scope="module")
def plane(tmp_path_factory, counting_s3):
    home = tmp_path_factory.mktemp("data-channels") / "home"
    home.mkdir()
    cp = ControlPlane(home, extra_env={**counting_s3.env(), "OMP_NUM_THREADS": "1"})
    cp.start()
    yield cp
    cp.stop()
    cp.cleanup_nodes()


@pytest.fixture(scope="module")
def bucket(counting_s3):
    with pytest.MonkeyPatch.context() as mp:
        yield counting_s3.fresh_bucket(mp.setenv, "data")


@pytest.fixture(scope="module")
def dataset(plane, bucket, tmp_path_factory):
    return prepare_dataset(plane, bucket, tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="module")
def file_job(plane, dataset, bucket, counting_s3, tmp_path_factory):
    """File mode, attempt 1 killed at step 2 (rank 0 exits 1): the chain relaunches it here."""
    mark = counting_s3.mark()
    job = _submit(
        plane,
        tmp_path_factory.mktemp("file-job"),
        "file-mode",
        [
            {"channel": "train", "s3_uri": dataset["uri"]},
            {"channel": "shards", "s3_uri": f"s3://{bucket}/shards/", "distribution": "ShardedByS3Key"},
        ],
        dataset["config"],
        # A relaunch (new nodes' directories, the host's channel cache), not an in-place restart.
        retry={"max_restarts": 1, "in_place_restarts": 0},
        env={"AERIE_FAULTS": json.dumps([{"kind": "exit", "step": 2, "rank": 0}])},
    )
    return {"job": job, "gets": counting_s3.object_gets(bucket, mark)}


def test_file_mode_channels_arrive_on_every_node_and_the_job_trains_on_them(plane, dataset, file_job):
    job = file_job["job"]
    assert job["state"] == "Completed", json.dumps(job)[:3000]
    assert [a["number"] for a in job["attempt_list"]] == [1, 2]
    root = plane.home / "jobs" / job["id"]
    train = {k.removeprefix("datasets/stdlib/"): v for k, v in dataset["objects"].items()}
    assert sorted(train) == ["corpus_text_document.bin", "corpus_text_document.idx"]
    for attempt in ("attempt-1", "attempt-2"):
        for host, share in (("algo-1", ["part-0.txt", "part-2.txt"]), ("algo-2", ["part-1.txt"])):
            data = root / attempt / host / "input" / "data"
            assert _files(data / "train") == train
            assert _files(data / "shards") == {s: SHARDS[f"shards/{s}"] for s in share}
    losses = rank_losses(plane.home / "jobs", job["id"])
    assert sorted(losses[2]) == list(range(1, STEPS + 1))
    log = (root / "attempt-1" / "algo-1" / "logs" / "node.log").read_text()
    assert "channel train: 2 object(s)" in log and "channel train ready in" in log


def test_a_relaunch_on_the_same_node_downloads_nothing(plane, dataset, file_job):
    """Every object left S3 once (the ranged GETs of one download), although two nodes in two
    attempts received it; attempt 2 was served by the host's cache."""
    settings = S3Settings.from_env()
    train = sorted(dataset["objects"].items())  # the agent fetches a channel's objects in key order
    tasks = equal_slices([(k, 0, len(v)) for k, v in train], settings.connections, settings.read_part_size)
    one_download = Counter(k for task in tasks for k, _, _ in task) + Counter(list(SHARDS))
    assert file_job["gets"] == one_download
    job = file_job["job"]
    root = plane.home / "jobs" / job["id"]
    records = {
        (a, h): json.loads((root / a / h / "agent" / "data_download.json").read_text())
        for a in ("attempt-1", "attempt-2")
        for h in ("algo-1", "algo-2")
    }
    total = sum(map(len, dataset["objects"].values()))
    first = [records[("attempt-1", h)]["channels"]["train"] for h in ("algo-1", "algo-2")]
    assert sum(r["downloaded_bytes"] for r in first) == total  # one node fetched, the other waited
    for h in ("algo-1", "algo-2"):
        second = records[("attempt-2", h)]
        assert second["bytes"] == 0 and second["channels"]["train"]["cached_bytes"] == total
        assert second["seconds"] >= 0 and second["channels"]["train"]["verified"] == {}
        assert second["channels"]["train"]["objects"] == 2


def test_fastfile_trains_from_s3_with_no_file_and_the_same_losses(plane, dataset, file_job, tmp_path_factory):
    job = _submit(
        plane,
        tmp_path_factory.mktemp("fastfile-job"),
        "fastfile-mode",
        [{"channel": "train", "s3_uri": dataset["uri"], "mode": "FastFile"}],
        dataset["config"],
    )
    assert job["state"] == "Completed", json.dumps(job)[:3000]
    root = plane.home / "jobs" / job["id"] / "attempt-1"
    for host in ("algo-1", "algo-2"):
        assert list((root / host / "input" / "data" / "train").iterdir()) == []
        record = json.loads((root / host / "agent" / "data_download.json").read_text())
        assert record["bytes"] == 0 and record["channels"]["train"]["mode"] == "FastFile"
    streamed = rank_losses(plane.home / "jobs", job["id"])[1]
    file_mode = rank_losses(plane.home / "jobs", file_job["job"]["id"])[2]
    assert streamed == file_mode  # bit for bit (float equality of every step's loss)
    assert sorted(streamed) == list(range(1, STEPS + 1))


def test_a_missing_prefix_fails_before_any_rank_starts_and_is_not_retried(plane, dataset, bucket, tmp_path_factory):
    uri = f"s3://{bucket}/no/such/prefix/"
    job = _submit(
        plane,
        tmp_path_factory.mktemp("missing-job"),
        "missing-input",
        [{"channel": "train", "s3_uri": uri}],
        dataset["config"],
        retry={"max_restarts": 3},
    )
    assert job["state"] == "Failed" and len(job["attempt_list"]) == 1, json.dumps(job)[:3000]
    reason = job["reason"]
    assert reason["kind"] == "input.unavailable" and reason["channel"] == "train" and reason["prefix"] == uri
    assert "not retried" in reason["message"] and "'train'" in reason["message"] and uri in reason["message"]
    root = plane.home / "jobs" / job["id"] / "attempt-1"
    for host in ("algo-1", "algo-2"):
        assert list((root / host / "agent" / "ranks").iterdir()) == []  # no rank ever started
        assert list((root / host / "output" / "metrics").iterdir()) == []
