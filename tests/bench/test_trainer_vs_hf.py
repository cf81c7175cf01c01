"""Smoke test of bench/trainer_vs_hf.py at a tiny size: it runs every variant in its own process,
checks that both models start from the same loss, and prints one JSON line with each
comparison. Speed is not asserted here (see the bench itself)."""

from __future__ import annotations

import json

import pytest

from tests.helpers.bench import run_bench


# Beside the unit tests (`make test`'s first phase): it runs no job and asserts no speed.
@pytest.mark.slow
@pytest.mark.side_by_side
def test_bench_prints_eager_and_bf16_lines_for_a_family():
    args = ["--family", "llama", "--no-compile", "--rounds", "2", "--steps", "1", "--warmup", "0"]
    args += ["--batch", "2", "--seq", "16", "--threads", "1"]
    result = json.loads(run_bench("trainer_vs_hf.py", *args, timeout=300)[-1])
    assert set(result["meets_goal"]) == {"llama_eager", "llama_bf16"}
    for line in ("eager", "bf16"):
        got = result["llama"][line]
        assert got["hf_tokens_per_s"] > 0 and got["ours_tokens_per_s"] > 0 and got["ratio"] > 0
    assert set(result["llama"]["first_loss"]) == {"hf", "ours", "hf_bf16", "ours_bf16"}
