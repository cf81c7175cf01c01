"""Log-derived progress in the agent: which node judges a trainer that prints on one rank only,
and which log records reach the control plane's curves."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from aerie_contracts import byo
from agent.config import AgentConfig
from agent.monitor import Monitor
from agent.progress_sources import prints_progress
from agent.supervisor import Supervisor
from tests.helpers.supervisor_parts import RecordingReporter, SampleMonitor, agent_config


def _cfg(tmp_path: Path, host: str) -> AgentConfig:
    return agent_config(tmp_path, host=host, entrypoint=("true",), procs_per_node=2)


def test_the_node_hosting_the_printing_rank_judges(tmp_path):
    hf = json.dumps({"preset": byo.PRESET_HF_TRAINER, "definitions": []})
    megatron = json.dumps({"preset": byo.PRESET_MEGATRON, "definitions": []})
    assert prints_progress(_cfg(tmp_path, "algo-1"), hf) and not prints_progress(_cfg(tmp_path, "algo-2"), hf)
    assert prints_progress(_cfg(tmp_path, "algo-2"), megatron) and not prints_progress(
        _cfg(tmp_path, "algo-1"), megatron
    )
    assert prints_progress(_cfg(tmp_path, "algo-2"), None)  # Aerie's own stream: every rank writes it


def test_a_blind_node_leaves_the_no_step_hang_to_others_until_it_sees_a_step(tmp_path):
    now = time.time()
    metrics = tmp_path / "output" / "metrics"
    metrics.mkdir(parents=True)

    def monitor(blind: bool) -> Monitor:
        mon = Monitor(
            node_dir=tmp_path / "agent",
            metrics_dir=metrics,
            interfaces=["lo"],
            accelerator="cpu",
            health={"startup_grace_s": 0, "first_step_timeout_s": 5, "hang_floor_s": 5},
            started_at=now - 60,
        )
        mon.blind_until_first_step = blind
        return mon

    assert [v.kind for v in monitor(blind=False).tick(now)] == ["silent.hang"]
    blind = monitor(blind=True)
    assert blind.tick(now) == []
    # Once its own ranks print steps (a trainer that logs on every rank), it judges as usual.
    rec = {"t": now - 30, "rank": 2, "step": 4, "loss": 1.0, "event": None, byo.SOURCE_KEY: byo.SOURCE_LOG}
    (metrics / "rank-00002.jsonl").write_text(json.dumps(rec) + "\n")
    assert [v.kind for v in blind.tick(now)] == ["silent.hang"]


def test_a_node_whose_ranks_all_exited_cleanly_is_not_hung(tmp_path):
    """After its last step a trainer saves and tears down; the node whose ranks already exited 0
    waits for its peers (seen in the HF e2e: torchrun on the master outlives its ranks)."""
    now = time.time()
    metrics = tmp_path / "output" / "metrics"
    metrics.mkdir(parents=True)
    (metrics / "rank-00000.jsonl").write_text(json.dumps({"t": now - 30, "rank": 0, "step": 30, "loss": 1.0}) + "\n")
    ranks = tmp_path / "agent" / "ranks"
    ranks.mkdir(parents=True)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (ranks / "rank-0.pid").write_text(str(dead.pid))

    def monitor() -> Monitor:  # a fresh one for each case
        return Monitor(
            node_dir=tmp_path / "agent",
            metrics_dir=metrics,
            interfaces=["lo"],
            accelerator="cpu",
            health={"startup_grace_s": 0, "hang_floor_s": 5},
            started_at=now - 60,
        )

    (ranks / "rank-0.exit.json").write_text(json.dumps({"rank": 0, "exit_code": 0, "signal": None}))
    assert monitor().tick(now) == []
    (ranks / "rank-0.exit.json").write_text(json.dumps({"rank": 0, "exit_code": 1, "signal": None}))
    assert [v.kind for v in monitor().tick(now)] == ["silent.hang"]


def test_a_bar_step_without_metrics_is_progress_only(tmp_path):
    monitor, reporter = SampleMonitor(), RecordingReporter()
    sup = Supervisor(_cfg(tmp_path, "algo-1"), monitor=monitor, reporter=reporter)
    log = {byo.SOURCE_KEY: byo.SOURCE_LOG, "rank": 0, "event": None}
    monitor.last_sample = {"records": [{**log, "t": 1.0, "step": 3}, {**log, "t": 1.1, "step": 3, "loss": 2.5}]}
    sup._tick(100.0)
    assert reporter.batches == [[{"t": 1.1, "step": 3, "loss": 2.5}]]
