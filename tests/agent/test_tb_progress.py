"""TensorBoard event files as a progress source (agent/tb_progress.py, issue #21).

Real writers (torch's `SummaryWriter`, what transformers.Trainer and torchtitan use, and
tensorboardX's), real event files, TensorBoard's own loader; the detectors and the node's agent
are the real ones. No stand-in.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from aerie_contracts import byo
from aerie_contracts.health import HealthSettings
from agent.monitor import Monitor
from agent.probes.progress import ProgressProbe
from agent.tb_progress import TensorBoardProgress, event_files

REPO = Path(__file__).resolve().parents[2]
SummaryWriter = pytest.importorskip("torch.utils.tensorboard").SummaryWriter


def _stream(metrics_dir: Path, rank: int = 0) -> list[dict]:
    path = metrics_dir / f"rank-{rank:05d}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _steps(records: list[dict]) -> list[int]:
    return [r["step"] for r in records]


def test_scalars_are_read_incrementally_while_the_writer_runs(tmp_path):
    tb, metrics = tmp_path / "tb", tmp_path / "metrics"
    tail = TensorBoardProgress(tb, metrics)
    assert tail.poll() == []  # nothing there yet: no directory at all
    writer = SummaryWriter(log_dir=str(tb))
    for step in (1, 2, 3):
        writer.add_scalar("train/loss", 4.0 / step, step)
        writer.add_scalar("train/learning_rate", 1e-3, step)
        writer.add_scalar("eval/loss", 9.0, step)  # unmapped: ignored
    writer.flush()
    first = tail.poll()
    # The newest step waits one poll (its flush may be on disk in part); the others are whole.
    assert _steps(first) == [1, 2]
    assert first[0]["loss"] == 4.0 and first[0]["lr"] == pytest.approx(1e-3)
    assert all(r["source"] == byo.SOURCE_TENSORBOARD and r["event"] is None and r["rank"] == 0 for r in first)
    assert _steps(tail.poll()) == [3]  # nothing more of step 3: it goes out
    assert tail.poll() == []
    writer.add_scalar("train/loss", 0.5, 4)
    writer.add_scalar("train/grad_norm", 2.0, 4)
    writer.flush()
    assert tail.poll() == []
    writer.close()
    last = tail.poll(final=True)
    assert _steps(last) == [4] and last[0]["grad_norm"] == 2.0
    stream = _stream(metrics)
    assert _steps(stream) == [1, 2, 3, 4]  # each step once, in the rank's metrics stream
    assert 0 < stream[-1]["t"] - stream[0]["t"] < 60  # the event's own wall time


def test_a_record_still_being_written_is_neither_fatal_nor_lost(tmp_path):
    """An event file copied a few bytes at a time, as a writer's flushes land: every poll in the
    middle of a record reads up to it, and the record is read once its last byte is there."""
    src = tmp_path / "src"
    writer = SummaryWriter(log_dir=str(src))
    for step in range(1, 9):
        writer.add_scalar("loss", float(step), step)
    writer.close()
    (path,) = event_files(src)
    data = path.read_bytes()
    growing = tmp_path / "tb" / path.name
    growing.parent.mkdir()
    growing.write_bytes(b"")
    tail = TensorBoardProgress(growing.parent, tmp_path / "metrics")
    seen: list[dict] = []
    for i in range(0, len(data), 13):
        with open(growing, "ab") as f:
            f.write(data[i : i + 13])
        seen += tail.poll()
    seen += tail.poll(final=True)
    assert _steps(seen) == list(range(1, 9))
    assert [r["loss"] for r in seen] == [float(s) for s in range(1, 9)]
    assert tail.errors == 0


def test_new_files_from_a_restarted_writer_and_old_ones_skipped(tmp_path):
    tb = tmp_path / "tb"
    old = SummaryWriter(log_dir=str(tb / "earlier-run"))
    old.add_scalar("loss", 1.0, 500)
    old.close()
    (stale,) = event_files(tb)
    os.utime(stale, (time.time() - 3600, time.time() - 3600))
    tail = TensorBoardProgress(tb, tmp_path / "metrics", since=time.time() - 60)
    assert tail.poll() == [] and tail.poll(final=True) == []  # an empty run's directory
    first = SummaryWriter(log_dir=str(tb / "run"))
    first.add_scalar("loss", 3.0, 1)
    first.add_scalar("loss", 2.0, 2)
    first.close()
    got = tail.poll()
    time.sleep(0.01)  # the next writer's file name (its creation time) sorts after the first's
    second = SummaryWriter(log_dir=str(tb / "run"))  # the trainer restarted: a second file
    second.add_scalar("loss", 1.5, 3)
    second.close()
    assert len(event_files(tb / "run")) == 2
    got += tail.poll() + tail.poll()
    assert _steps(got) == [1, 2, 3]  # the earlier run's step 500 never counted


def test_tags_map_onto_stream_keys(tmp_path):
    tb = tmp_path / "tb"
    writer = SummaryWriter(log_dir=str(tb))
    # torchtitan's names
    writer.add_scalar("loss_metrics/global_avg_loss", 2.5, 1)
    writer.add_scalar("grad_norm", 0.7, 1)
    writer.add_scalar("lr", 3e-4, 1)
    writer.add_scalar("mfu(%)", 41.0, 1)
    # transformers.Trainer's
    writer.add_scalar("train/loss", 2.0, 2)
    writer.add_scalar("train/epoch", 0.5, 2)
    # the spec's own tag, and one it overrides
    writer.add_scalar("custom/tokens_per_s", 1000.0, 3)
    writer.add_scalar("loss", 1.0, 3)
    writer.add_histogram("train/loss", np.array([1.0, 2.0, 3.0]), 3)  # not a scalar: ignored
    writer.add_scalar("unmapped/thing", 5.0, 4)  # no mapped tag at step 4: no step
    writer.close()
    tags = byo.validate_tensorboard({"tags": {"custom/tokens_per_s": "tps", "loss": "raw_loss"}})["tags"]
    tail = TensorBoardProgress(tb, tmp_path / "metrics", tags=tags, rank=3)
    got = {r["step"]: r for r in tail.poll(final=True)}
    assert sorted(got) == [1, 2, 3]
    assert {k: got[1][k] for k in ("loss", "grad_norm", "lr", "mfu")} == pytest.approx(
        {"loss": 2.5, "grad_norm": 0.7, "lr": 3e-4, "mfu": 41.0}
    )
    assert got[2]["loss"] == 2.0 and got[2]["epoch"] == 0.5
    assert got[3]["tokens_per_s"] == 1000.0 and got[3]["raw_loss"] == 1.0 and "loss" not in got[3]
    assert all(r["rank"] == 3 for r in got.values()) and _stream(tmp_path / "metrics", rank=3)


def test_spec_setting_is_validated_and_reaches_the_node(tmp_path):
    from orchestrator.backends.nodeenv import log_metrics_env
    from orchestrator.spec import JobSpec

    base = {"name": "tb", "entrypoint": ["python", "train.py"]}
    spec = JobSpec.model_validate({**base, "metrics": "tensorboard"})
    assert spec.metrics is not None and spec.metrics.tensorboard == {
        "dir": byo.TB_DEFAULT_DIR,
        "tags": {},
        "flush_s": byo.TB_FLUSH_S,
    }
    spec = JobSpec.model_validate(
        {**base, "metrics": {"preset": "hf-trainer", "tensorboard": {"tags": {"my/loss": "train:loss"}, "flush_s": 0}}}
    )
    assert spec.metrics is not None and spec.metrics.tensorboard is not None
    assert spec.metrics.tensorboard["tags"] == {"my/loss": "loss"}  # SageMaker-style names map too
    for value, message in (("rel/dir", "an absolute path"), ("/opt/ml/../etc", "an absolute path"), (7, "a directory")):
        with pytest.raises(ValidationError, match=message):
            JobSpec.model_validate({**base, "metrics": {"tensorboard": value}})
    for setting, message in (
        ({"tags": {"x": "step"}}, "the step is the event's own"),
        ({"tags": {"x": "Bad Key!"}}, "cannot be a metrics key"),
        ({"tags": ["loss"]}, "a mapping"),
        ({"flush_s": -1}, "between 0 and 3600"),
        ({"logdir": "/x"}, "unknown field"),
        ({"tags": {f"t{i}": "loss" for i in range(41)}}, "at most 40"),
    ):
        with pytest.raises(ValidationError, match=message):
            JobSpec.model_validate({**base, "metrics": {"tensorboard": setting}})
    with pytest.raises(ValidationError, match="or tensorboard: true"):
        JobSpec.model_validate({**base, "metrics": {"tensorboard": False}})

    # The node gets it in AERIE_LOG_METRICS; /opt/ml lands under the node's ML root.
    spec = JobSpec.model_validate({**base, "metrics": {"tensorboard": {"dir": "/opt/ml/output/tb"}}})
    value = log_metrics_env(spec)["AERIE_LOG_METRICS"]
    tail = TensorBoardProgress.from_env(value, tmp_path / "ml", tmp_path / "metrics", rank=0)
    assert tail is not None and tail.directory == tmp_path / "ml" / "output" / "tb"
    from agent.logparse import LogParser

    assert LogParser.from_env(value, 0) is None  # no log rules: the ranks' output is not parsed
    assert TensorBoardProgress.from_env(json.dumps({"preset": "megatron"}), tmp_path, tmp_path, 0) is None


def test_a_step_counts_once_across_sources():
    """Log lines are real time, TensorBoard lags by its flush: a TensorBoard step the rank already
    has from its log is no new step, nor is a log step TensorBoard gave first."""
    probe = ProgressProbe(Path("/nonexistent"))

    def rec(step, source, loss=None, t=None):
        return {
            "t": float(step) if t is None else t,
            "rank": 0,
            "step": step,
            "loss": loss,
            "event": None,
            "source": source,
        }

    tb, log = byo.SOURCE_TENSORBOARD, byo.SOURCE_LOG
    for step in (1, 2, 3):
        assert probe.ingest(rec(step, log))
    assert not probe.ingest(rec(2, tb, loss=1.0))  # behind the log: dropped
    assert probe.ingest(rec(4, tb, loss=0.9))  # ahead: a step
    assert not probe.ingest(rec(4, log))  # the log's own line for it: already counted
    assert probe.ingest(rec(5, log))
    assert probe.ingest(rec(6, tb))  # TensorBoard only, its loss in a later flush ...
    assert probe.ingest(rec(6, tb, loss=float("nan")))  # ... fills the step in, not a second step
    assert [s[1] for s in probe.steps[0]] == [1, 2, 3, 4, 5, 6]
    assert math.isnan(probe.steps[0][-1][2]) and probe.first_nan[0]["step"] == 6
    assert probe.repeated == 2


def test_tensorboard_steps_reach_the_detectors(tmp_path):
    """The tail writes the metrics stream the monitor's progress probe reads: steps from
    TensorBoard alone are the node's progress, and a NaN loss there is a loss.nan verdict."""
    node, metrics = tmp_path / "agent", tmp_path / "metrics"
    monitor = Monitor(node_dir=node, metrics_dir=metrics, health={"accelerator": "cpu"}, interfaces=[], started_at=0)
    tail = TensorBoardProgress(tmp_path / "tb", metrics)
    writer = SummaryWriter(log_dir=str(tmp_path / "tb"))
    for step in range(1, 6):
        writer.add_scalar("train/loss", 2.0 - step / 10, step)
    writer.flush()
    tail.poll()
    assert monitor.tick() == []
    tail.poll()
    assert monitor.tick() == []
    assert monitor.summary()["last_step"] == 5
    assert monitor.summary()["last_loss"] == pytest.approx(1.5)
    writer.add_scalar("train/loss", float("nan"), 6)
    writer.close()
    tail.poll(final=True)
    verdicts = monitor.tick()
    assert [v.kind for v in verdicts] == ["loss.nan"] and verdicts[0].evidence["step"] == 6


def test_the_hang_floor_allows_for_the_writers_flush():
    from agent.progress_sources import tb_health

    tb_only = json.dumps({"preset": None, "definitions": [], "tensorboard": {"flush_s": 120}})
    floor_30 = HealthSettings(hang_floor_s=30)
    assert tb_health(floor_30, tb_only).hang_floor_s == 150
    assert tb_health(floor_30, tb_only) == dataclasses.replace(floor_30, hang_floor_s=150)  # nothing else moves
    assert tb_health(HealthSettings(), tb_only).hang_floor_s == HealthSettings().hang_floor_s + 120
    with_log = json.dumps({"preset": "hf-trainer", "definitions": [], "tensorboard": {"flush_s": 120}})
    assert tb_health(floor_30, with_log) == floor_30  # log lines are real time
    flushed = json.dumps({"tensorboard": {"flush_s": 0}})
    assert tb_health(floor_30, flushed) == floor_30
    assert tb_health(floor_30, None) == floor_30


TRAINER = """
import math, os, sys, time
from tensorboardX import SummaryWriter  # the writer a torch-free trainer uses

# TENSORBOARD_LOGGING_DIR: the agent points transformers.Trainer's variable at its directory.
# tensorboardX's flush() does not wait for its writer thread: flush_secs bounds how late a step lands.
w = SummaryWriter(os.environ["TENSORBOARD_LOGGING_DIR"], flush_secs=1)
for step in range(1, 6):
    w.add_scalar("train/loss", math.nan if step == 5 else 2.0 / step, step)
    w.flush()
    time.sleep(0.2)
time.sleep(60)  # trains on past its NaN: the agent must stop it
"""


def test_the_agent_stops_a_tensorboard_only_trainer_on_its_nan(tmp_path):
    """A node whose trainer reports progress only through TensorBoard: the agent tails its event
    files, the loss.nan detector fires on the NaN step, and the node ends with that verdict."""
    from aerie_contracts.container import NodeContract

    contract = NodeContract(ml_root=tmp_path / "algo-1", hosts=("algo-1",), current_host="algo-1")
    contract.write()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AERIE_", "SM_", "TENSORBOARD_"))}
    env.update(contract.env())
    env.update(
        {
            "AERIE_ENTRYPOINT": json.dumps([sys.executable, "-c", TRAINER]),
            "AERIE_HEALTH": json.dumps({"sample_s": 0.2, "accelerator": "cpu", "probe": "on"}),
            "AERIE_WORKDIR": str(REPO),
            "AERIE_LOG_METRICS": json.dumps({"preset": None, "definitions": [], "tensorboard": {}}),
        }
    )
    proc = subprocess.run(
        [sys.executable, "-m", "agent.entrypoint"], env=env, cwd=REPO, capture_output=True, text=True, timeout=90
    )
    outcome = json.loads((contract.node_dir / "exit.json").read_text())
    assert outcome["reason"]["kind"] == "loss.nan", proc.stdout + proc.stderr
    assert "at step 5" in outcome["reason"]["message"]
    rank_exit = json.loads((contract.node_dir / "ranks" / "rank-0.exit.json").read_text())
    assert rank_exit["signal"] is not None  # stopped by the agent, not run to its end
    stream = _stream(contract.metrics_dir)
    assert _steps(stream) == [1, 2, 3, 4, 5] and {r["source"] for r in stream} == {"tensorboard"}
    assert event_files(contract.ml_root / "output" / "tensorboard")  # where SageMaker has it


def test_a_real_hf_trainer_reporting_to_tensorboard_is_the_nodes_progress(tmp_path):
    """transformers.Trainer with `report_to=tensorboard` and no log rules: the agent exports
    TENSORBOARD_LOGGING_DIR, HF writes its event files there, and its steps and losses reach the
    node's metrics stream and heartbeat-side progress from those files alone."""
    pytest.importorskip("transformers")
    from aerie_contracts.container import NodeContract

    contract = NodeContract(ml_root=tmp_path / "algo-1", hosts=("algo-1",), current_host="algo-1")
    contract.write()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AERIE_", "SM_", "TENSORBOARD_"))}
    env.update(contract.env())
    command = ["python", "examples/byo/hf_train.py", "--max-steps", "4", "--save-steps", "100"]
    env.update(
        {
            "AERIE_ENTRYPOINT": json.dumps(
                [*command, "--output-dir", str(tmp_path / "out"), "--report-to", "tensorboard"]
            ),
            "AERIE_HEALTH": json.dumps({"sample_s": 0.2, "accelerator": "cpu", "probe": "on"}),
            "AERIE_WORKDIR": str(REPO),
            "AERIE_LOG_METRICS": json.dumps({"preset": None, "definitions": [], "tensorboard": {"flush_s": 0}}),
        }
    )
    proc = subprocess.run(
        [sys.executable, "-m", "agent.entrypoint"], env=env, cwd=REPO, capture_output=True, text=True, timeout=180
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    # With `health.probe: on`, the in-process probe (agent/inproc) writes the same stream too.
    stream = [r for r in _stream(contract.metrics_dir) if r["source"] != "probe"]
    assert _steps(stream) == [1, 2, 3, 4]
    assert all(r["source"] == "tensorboard" and math.isfinite(r["loss"]) and "lr" in r for r in stream)
    assert event_files(contract.ml_root / "output" / "tensorboard")
