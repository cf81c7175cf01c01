"""Smoke test of bench/goodput_at_scale.py with a short horizon and no measurement (fast): it runs,
prints one JSON line with the three policies, names every parameter with its source, and says
that policy (c) rests on assumed recovery costs. Speed and the goals are not asserted here."""

from __future__ import annotations

import json

import pytest

from tests.helpers.bench import run_bench


def test_bench_prints_three_policies_and_names_every_parameter(tmp_path):
    args = ["--days", "3", "--replications", "2", "--no-measure", "--plot", str(tmp_path / "goodput.png")]
    lines = run_bench("goodput_at_scale.py", *args, timeout=120)
    assert len(lines) == 1
    result = json.loads(lines[0])
    assert set(result["policies"]) == {"a_baseline", "b_aerie_relaunch_s3", "c_aerie_in_place"}
    for name, policy in result["policies"].items():
        assert 0 < policy["goodput"] <= 1, name
        assert policy["goodput"] + sum(policy["badput_share"].values()) == pytest.approx(1)
    params = result["parameters"]
    assert all(p["source"] in {"measured", "assumed", "published", "spec default", "derived"} for p in params.values())
    assert result["measured"] == [] and "in_place_restart_s" in result["assumed"]
    assert result["policy_c_uses_assumed_recovery"] is True
    assert set(result["goals"]) == {"c_goodput_at_least_0.98", "a_over_c_badput_at_least_5x"}
    assert (tmp_path / "goodput.png").stat().st_size > 1000
