"""Smoke test of bench/detect.py at its cheapest (one kind, one run), so the bench cannot rot: a
real control plane and a 2 x 2 run of the tiny trainer, a rank SIGKILLed, one JSON line naming
every parameter, with the collective timeout read from the run (the trainer's log), not a
constant. Speed is not asserted (see the bench's goal)."""

from __future__ import annotations

import json

import pytest

from tests.helpers.bench import run_bench
from trainer import parallel


@pytest.mark.slow
def test_bench_detects_a_killed_rank_and_reads_the_collective_timeout_from_the_run():
    result = json.loads(run_bench("detect.py", "--faults", "sigkill", "--runs", "1", timeout=300)[-1])
    assert result["params"]["runs"] == 1 and result["params"]["faults"] == ["sigkill"]
    assert "max(30 s, 3 x p95" in result["goal"]
    sigkill = result["kinds"]["sigkill"]
    assert sigkill["reasons"] == ["exit.nonzero"], sigkill
    assert sigkill["collective_timeout_s"] == parallel.COLLECTIVE_TIMEOUT_S, sigkill
    assert sigkill["detect_s_max"] > 0 and sigkill["ratio_vs_collective_timeout"] > 0, sigkill
