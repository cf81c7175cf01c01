"""Smoke test of bench/data.py at a tiny size, so the bench cannot rot: both phases run (the agent's
File-mode download and the download_file loop through the throttling proxy, then the tiny model
trained from the channel directory and streamed from S3) and one JSON line comes out. Speed is
not asserted here (see the bench itself); that both training runs log the same losses is."""

from __future__ import annotations

import json

import pytest

from tests.helpers.bench import run_bench


# Not timing-sensitive: `make test` runs it with the unit tests, on two workers (tests/conftest.py):
# downloads through a proxy and a 6-step run of one rank; speed is not asserted.
@pytest.mark.slow
@pytest.mark.side_by_side
def test_bench_prints_download_and_fastfile_lines():
    download_args = ["--size-mb", "6", "--objects", "3", "--connections", "4"]
    train_args = ["--train-mb", "1", "--steps", "6", "--warmup", "2"]
    result = json.loads(run_bench("data.py", *download_args, *train_args, timeout=600)[-1])
    download = result["file_mode_download"]
    assert download["aerie_MBps"] > 0 and download["baseline_download_file_loop_MBps"] > 0
    assert download["aerie_verified"] == {"CRC32": 3}
    assert download["aerie_vs_bound"] > 0 and download["bound_MBps"] > 0
    training = result["fastfile_training"]
    assert training["file_tokens_per_s"] > 0 and training["fastfile_tokens_per_s"] > 0
    assert training["same_losses"] is True
