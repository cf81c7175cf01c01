"""Acceptance 1 of issue #19, end to end: a real 2-node x 2-process run of the tiny trainer on the
local backend, rank 3 (node algo-2) sleeping 0.3 s a step (the `slow` fault). Every step is as
slow everywhere (lockstep); rank 3's compute time is not. The controller names algo-2 a
straggler, and with `straggler: restart` the next attempt runs without it (on the spare slot).

The spec shortens `straggler_persist_s` to 5 s (the default is 30 s) and the heartbeat to 2 s
(default 5 s). Why not the defaults here: they would add ~25-30 s to a suite already at its time
limit, and timing belongs to benches, not tests. The "within 60 s" of the acceptance line at the
default settings is shown by bench/detect.py's `straggler` kind instead (defaults but for
`straggler: restart`, which ends the attempt at the verdict without changing when it comes; median
and max over 3 runs in bench/results/detect.txt). This test keeps the behaviour: the right node and
signal, the evidence, and the exclusion on restart; its own bound is loose (60 s from submission).
"""

from __future__ import annotations

import time

import pytest

from devtools.harness.control_plane import ControlPlane
from devtools.harness.jobs import trainer_spec

pytestmark = pytest.mark.slow


def test_a_slow_rank_makes_its_node_a_straggler_and_restart_excludes_it(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    cp = ControlPlane(home).start()
    try:
        faults = [
            {"kind": "slow", "step": 2, "rank": 3, "seconds": 0.3},
            {"kind": "exit", "step": 1, "attempt": 2, "code": 2},  # attempt 2 only has to start
        ]
        health = {"straggler": "restart", "straggler_persist_s": 5}
        spec = trainer_spec(
            tmp_path / "spec.json",
            "straggler",
            steps=100_000,
            faults=faults,
            max_restarts=1,
            memory_every_steps=0,  # attempt 2 starts from scratch, where its exit fault is
            health=health,
            backend_options={"node_slots": 3},
        )
        cp.cli("submit", str(spec), check=True)
        submitted = time.time()
        job = cp.wait_state("straggler", {"Completed", "Failed", "Stopped"}, timeout_s=180)
        first = job["attempt_list"][0]
        assert first["reason"]["kind"] == "node.straggler" and first["reason"]["host"] == "algo-2", first["reason"]
        (verdict,) = [v for v in job["verdicts"] if v["kind"] == "node.straggler"]
        ev = verdict["evidence"]
        assert verdict["host"] == "algo-2" and ev["signal"] == "compute" and ev["slowest_rank"] == "3", ev
        assert ev["value"] > ev["peers_median"] + 0.2, ev
        print(f"straggler verdict {verdict['t'] - submitted:.1f}s after submission")
        assert verdict["t"] - submitted < 60, verdict["t"] - submitted
        second = job["attempt_list"][1]
        assert second["exclude_nodes"] == ["algo-2"], second
        assert sorted(n["host"] for n in second["nodes"]) == ["algo-1", "algo-3"], second
    finally:
        cp.stop()
        cp.cleanup_nodes()
