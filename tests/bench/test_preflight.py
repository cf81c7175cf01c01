"""Issue #23, acceptance 3: pre-flight on a healthy 2-node local set-up completes in <= 15 s and
raises no failure in 20 consecutive runs. Runs bench/preflight.py as a user would (its two nodes'
checks side by side on this machine: numpy burn, TCP all-reduce and link probe, host memory,
/dev/shm); the 15 s bound is the acceptance line itself. Load-tolerant by construction: the CPU burn
is a rate per second of CPU time (a shared core is not a slow core), the floors are ones only
broken hardware misses, and a run takes ~2.5 s here, ~3 s at load 12 on 2 cores."""

from __future__ import annotations

import json

import pytest

from tests.helpers.bench import run_bench

pytestmark = [pytest.mark.slow, pytest.mark.side_by_side]

RUNS = 20


def test_twenty_consecutive_preflights_of_a_healthy_two_node_job_pass_within_15_s():
    line = json.loads(run_bench("preflight.py", "--runs", str(RUNS), timeout=RUNS * 15 + 120)[-1])
    print(f"pre-flight x{RUNS}: p50 {line['p50_s']} s, max {line['max_s']} s, slowest node {line['slowest_node']}")
    assert line["runs"] == RUNS and line["failures"] == 0, line["failed"]
    assert line["max_s"] <= line["goal_s"] == 15.0
