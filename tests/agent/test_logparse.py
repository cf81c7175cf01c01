"""Log presets and MetricDefinitions against trainers' real output (agent/logparse.py).

The HF Trainer preset is checked against the lines the installed `transformers.Trainer` prints, run
in-process on CPU; Megatron-LM, torchtitan and Lightning are not installed, so their presets are
checked against their documented formats (tests/data/logs/README.md says where each comes from).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
from pathlib import Path

import pytest

from aerie_contracts import byo
from aerie_contracts.health import HealthSettings
from aerie_contracts.metrics import MetricEvent
from agent.logparse import LogParser, SegmentSplitter
from agent.monitor import Observations
from agent.probes.progress import ProgressProbe

LOGS = Path(__file__).resolve().parents[1] / "data" / "logs"
ROOT = Path(__file__).resolve().parents[2]


def parse(parser: LogParser, data: bytes) -> list[dict]:
    split = SegmentSplitter()
    return [r for seg in split.push(data + b"\n") for r in parser.feed(seg, now=1.0)]


def run_hf_train(out_dir: Path, *args: str) -> bytes:
    """A tiny transformers.Trainer run (the example user script), its stdout and stderr as printed."""
    pytest.importorskip("accelerate")
    sys.path.insert(0, str(ROOT / "examples" / "byo"))
    try:
        import hf_train
    finally:
        sys.path.pop(0)
    out = io.StringIO()  # one stream, as the rank wrapper reads them (stderr into stdout)
    argv = sys.argv
    sys.argv = ["hf_train.py", "--output-dir", str(out_dir), *args]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            hf_train.main()
    finally:
        sys.argv = argv
    return out.getvalue().encode()


@pytest.fixture(scope="module")
def hf_output(tmp_path_factory) -> bytes:
    return run_hf_train(tmp_path_factory.mktemp("hf"), "--max-steps", "4", "--save-steps", "2")


def test_hf_trainer_preset_on_real_output(hf_output):
    recs = parse(LogParser(preset=byo.PRESET_HF_TRAINER), hf_output)
    # The bar's "4/4" ends training: one train_end record (the wind-down: HF's final save, teardown).
    ends = [r for r in recs if r["event"] == MetricEvent.TRAIN_END]
    assert [r["step"] for r in ends] == [4]
    recs = [r for r in recs if r["event"] is None]
    assert sorted({r["step"] for r in recs}) == [1, 2, 3, 4]  # the training bar; shard-writing bars ignored
    with_loss = [r for r in recs if "loss" in r]
    assert [r["step"] for r in with_loss] == [1, 2, 3, 4]  # each logs dict attached to its step
    assert all(r["loss"] > 0 and r["grad_norm"] > 0 and r["lr"] > 0 for r in with_loss)
    assert all(r["event"] is None and r[byo.SOURCE_KEY] == byo.SOURCE_LOG for r in recs)
    assert b"train_runtime" in hf_output  # the summary dict (train_loss) is not a step
    assert max(r["step"] for r in recs) == 4


def test_hf_evaluation_bar_is_no_training_step(tmp_path):
    """HF's evaluation bar (tqdm position 1, under the training bar) counts eval batches: here 10,
    the same total as the training bar's 10 steps. Read as the training bar, the evaluation at step
    4 made the step jump to 10 and ended the run (`train_end`) mid-training. A nested bar's segment
    ends in tqdm's cursor-up; it is never a step."""
    out = run_hf_train(tmp_path, "--max-steps", "10", "--save-steps", "100", "--eval-steps", "4", "--eval-rows", "40")
    assert b"/10 [" in out and b"\x1b[A" in out  # the evaluation bar, drawn nested, as HF prints it
    recs = parse(LogParser(preset=byo.PRESET_HF_TRAINER), out)
    steps = [r["step"] for r in recs if r["event"] is None]
    assert sorted(set(steps)) == list(range(1, 11)) and steps == sorted(steps), steps
    assert [r["step"] for r in recs if r["event"] == MetricEvent.TRAIN_END] == [10]


def test_hf_logs_dict_belongs_to_the_bar_drawn_after_it():
    """tqdm.write redraws the bar after the dict; the bar's own draw of that step may lag (rate-limited),
    as captured from a 4-rank run: the dict of step 1 came before any draw of 1/30."""
    out = (
        b"\r  0%|          | 0/30 [00:00<?, ?it/s]\r                    \r{'loss': '5.548', 'grad_norm': '3.094', "
        b"'learning_rate': '0.001', 'epoch': '0.03125'}\n\r  3%|3         | 1/30 [00:00<00:10,  2.87it/s]"
        b"\r  7%|6         | 2/30 [00:00<00:05,  5.05it/s]\r                    \r{'loss': '5.436'}\n"
        b"\r  7%|6         | 2/30 [00:00<00:05,  5.05it/s]"
    )
    recs = parse(LogParser(preset=byo.PRESET_HF_TRAINER), out)
    assert [(r["step"], r.get("loss")) for r in recs] == [(1, 5.548), (2, None), (2, 5.436)]


def test_megatron_preset_documented_format():
    recs = parse(LogParser(preset=byo.PRESET_MEGATRON), (LOGS / "megatron.txt").read_bytes())
    assert [r["step"] for r in recs] == [1, 2, 3]
    assert recs[0]["loss"] == pytest.approx(10.84521) and recs[0]["grad_norm"] == pytest.approx(12.345)
    assert recs[0]["lr"] == pytest.approx(1.5e-5) and recs[1]["step_s"] == pytest.approx(0.4567)
    assert recs[2]["loss"] != recs[2]["loss"]  # "lm loss: nan" is a NaN (loss.nan sees it)


def test_torchtitan_preset_documented_format():
    recs = parse(LogParser(preset=byo.PRESET_TORCHTITAN), (LOGS / "torchtitan.txt").read_bytes())
    assert [r["step"] for r in recs] == [1, 10]  # "Training starts at step 1" is not a step
    assert recs[0]["loss"] == pytest.approx(12.2541) and recs[0]["grad_norm"] == pytest.approx(3.4127)
    assert recs[1]["tokens_per_s"] == 12345 and recs[1]["mfu"] == pytest.approx(0.31) and "mfu" not in recs[0]


def test_lightning_preset_documented_format():
    recs = parse(LogParser(preset=byo.PRESET_LIGHTNING), (LOGS / "lightning.txt").read_bytes())
    assert [(r["step"], r["loss"]) for r in recs] == [(5, 2.31), (10, 2.12), (13, 1.95)]  # validation bar ignored


def test_metric_definitions_without_a_step_count_steps():
    defs = [{"Name": "train:loss", "Regex": r"loss=([0-9.]+)"}, {"Name": "lr", "Regex": r"lr=([0-9.e-]+)"}]
    recs = parse(LogParser(definitions=defs), b"epoch 1 loss=2.5 lr=1e-3\nhello\nloss=2.25\n")
    assert [(r["step"], r["loss"]) for r in recs] == [(1, 2.5), (2, 2.25)] and recs[0]["lr"] == 0.001


def test_metric_definitions_with_a_step():
    defs = [{"Name": "global_step", "Regex": r"step (\d+)"}, {"Name": "loss", "Regex": r"loss ([0-9.]+)"}]
    recs = parse(LogParser(definitions=defs), b"step 7 loss 1.5\nstep 8\n")
    assert [(r["step"], r.get("loss")) for r in recs] == [(7, 1.5), (8, None)]


@pytest.mark.parametrize(
    "garbage",
    [b"\xff\xfe\x00binary", b"{'loss': 'abc'}", b"iteration x/y |", b"step: 1 loss: --", b"\r\r\r", b"x" * 100_000],
)
def test_non_matching_lines_are_ignored(garbage):
    for preset in byo.PRESETS:
        assert parse(LogParser(preset=preset), garbage) == []


def test_bad_definitions_are_refused_clearly():
    with pytest.raises(ValueError, match="capture group"):
        LogParser(definitions=[{"Name": "loss", "Regex": "loss"}])
    with pytest.raises(ValueError, match="does not compile"):
        LogParser(definitions=[{"Name": "loss", "Regex": "loss ([0-9"}])
    with pytest.raises(ValueError, match="unknown metrics preset"):
        LogParser(preset="keras")
    assert LogParser.from_env("not json", 0) is None


def test_a_raw_create_training_job_metric_definition_drives_progress(tmp_path):
    """MetricDefinitions from a raw CreateTrainingJob request -> the spec -> the node's env ->
    the rank wrapper parsing real output -> the metrics stream -> the progress probe."""
    from orchestrator.backends.nodeenv import log_metrics_env
    from orchestrator.sagemaker_mapping import spec_dict_from_request
    from orchestrator.spec import JobSpec

    request = json.loads((ROOT / "tests" / "data" / "create_training_job.json").read_text())
    request["AlgorithmSpecification"]["MetricDefinitions"] = [
        {"Name": "train:loss", "Regex": r"train_loss=([0-9.]+)"},
        {"Name": "train:step", "Regex": r"step=(\d+)"},
    ]
    spec = JobSpec.model_validate(spec_dict_from_request(request))
    env = {**os.environ, **log_metrics_env(spec), "AERIE_ML_ROOT": str(tmp_path), "RANK": "0"}
    env["AERIE_METRICS_PATH"] = str(tmp_path / "metrics")
    script = "import time\nfor i in range(1, 4):\n    print(f'step={i} train_loss={3.0 / i:.3f}', flush=True)\n"
    import subprocess

    out = subprocess.run(
        [sys.executable, "-m", "agent.rank", "--", sys.executable, "-c", script],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "step=3 train_loss=1.000" in out  # the output itself passes through unchanged
    probe = ProgressProbe(tmp_path / "metrics")
    obs = Observations(probe, HealthSettings.from_dict({}))
    obs.add({"now": 5.0, "records": probe.sample()})
    assert probe.last_step() == 3 and probe.last_loss() == pytest.approx(1.0)
    assert [s[1] for s in obs.window(5.0, 0.0).steps["0"]] == [1, 2, 3]


def test_megatrons_last_iteration_ends_training_once():
    """`iteration N/ N` is the run's last step: a train_end record follows it (the wind-down, judged
    by its own limit), once; earlier iterations give none."""
    line = " [2024-05-01 10:00:0{i}] iteration        {i}/       3 | lm loss: 1.0E+01 |\n"
    text = "".join(line.format(i=i) for i in (1, 2, 3, 3)).encode()
    recs = parse(LogParser(preset=byo.PRESET_MEGATRON), text)
    assert [(r["step"], r["event"]) for r in recs] == [(1, None), (2, None), (3, None), (3, "train_end"), (3, None)]
