"""The agent forwards global rank 0's training steps to the control plane in batches (the
dashboard's durable curves): steps only, rank 0 only, NaN as null, at most every few seconds."""

from __future__ import annotations

from pathlib import Path

from agent.supervisor import Supervisor
from tests.helpers.supervisor_parts import RecordingReporter, SampleMonitor, agent_config


def test_rank0_steps_are_batched_and_json_safe(tmp_path: Path):
    cfg = agent_config(tmp_path, hosts=("algo-1",), host="algo-1", entrypoint=("true",))
    monitor, reporter = SampleMonitor(), RecordingReporter()
    sup = Supervisor(cfg, monitor=monitor, reporter=reporter)
    monitor.last_sample = {
        "records": [
            {"t": 1.0, "rank": 0, "step": 1, "loss": 3.5, "event": None, "step_s": 0.1, "tokens": 10},
            {"t": 1.0, "rank": 1, "step": 1, "loss": 3.6, "event": None},
            {"t": 1.1, "rank": 0, "step": 1, "event": "checkpoint_begin"},
            {"t": 1.2, "rank": 0, "step": 2, "loss": float("nan"), "event": None, "tokens_per_s": 900.0},
        ]
    }
    sup._tick(100.0)  # first batch goes at once (nothing sent yet)
    assert reporter.batches == [
        [{"t": 1.0, "step": 1, "loss": 3.5}, {"t": 1.2, "step": 2, "loss": None, "tokens_per_s": 900.0}]
    ]
    monitor.last_sample = {"records": [{"t": 2.0, "rank": 0, "step": 3, "loss": 3.0, "event": None}]}
    sup._tick(100.5)  # within METRICS_EVERY_S: held back
    assert len(reporter.batches) == 1
    monitor.last_sample = {"records": []}
    sup._tick(103.0)
    assert reporter.batches[-1] == [{"t": 2.0, "step": 3, "loss": 3.0}]
