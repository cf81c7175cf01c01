"""The `lightning` log preset against what PyTorch Lightning 2.6 really prints (agent/logparse.py).

The stock user script (examples/byo/lightning_train.py: default progress bar, default logger,
`trainer.fit(..., ckpt_path="last")`) runs in a subprocess with its output a pipe, stderr into
stdout, as agent/rank.py runs a rank, and its output is fed through SegmentSplitter and LogParser
as it comes (the parser reads the restored checkpoint's step when Lightning names the file). Every
step given must be Lightning's own `global_step` at that point, never going back, ending at the
script's final `trainer.global_step`; every loss must be the one Lightning logged for that step
(its TensorBoard event of step S-1, the logger's step being the batches stepped before). Formats:

- Rich (the default, `rich` being installed) in a pipe: nothing until fit ends, then the stop line
  and one frame (`Epoch 2/-2 ━━━ 6/6 0:00:00 • ...` with `train_loss: ..` on the next line);
- Rich in a terminal-like stream (TTY_COMPATIBLE=1): frames redrawn with cursor controls;
- tqdm (`TQDMProgressBar`): `Epoch E: P%|..| i/n [..]` every batch, the resumed epoch drawn as
  `Training: |  | i/? [..]`, the last epoch's n being the steps left.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from aerie_contracts import byo
from aerie_contracts.metrics import MetricEvent
from agent.logparse import LogParser, SegmentSplitter

pytest.importorskip("lightning")

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "byo" / "lightning_train.py"
# A terminal's settings in the test's own environment must not change what the child prints.
_TERMINAL_ENV = ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "COLUMNS", "LINES", "NO_COLOR")


def run_live(args: list[str], env: dict[str, str] | None = None, timeout: float = 180) -> dict:
    """Run the script, parse its output as it comes; {"records", "raw", "global_step"}."""
    child_env = {k: v for k, v in os.environ.items() if k not in _TERMINAL_ENV}
    child_env.update(env or {})
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT), *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=child_env
    )
    parser, split = LogParser(rank=0, preset=byo.PRESET_LIGHTNING), SegmentSplitter()
    records: list[dict] = []
    raw = b""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    while True:
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        raw += chunk
        for seg in split.push(chunk):
            records.extend(parser.feed(seg, now=1.0))
    for seg in split.push(b"\n"):
        records.extend(parser.feed(seg, now=1.0))
    assert proc.wait(timeout) == 0, raw.decode(errors="replace")[-3000:]
    assert parser.errors == 0
    m = re.search(rb"global_step=(\d+)", raw)
    assert m, raw.decode(errors="replace")[-3000:]
    return {"records": records, "raw": raw, "global_step": int(m.group(1))}


def logged_losses(root: Path, version: int = 0) -> dict[int, float]:
    """{Lightning's global_step after the step: train_loss} from one run's TensorBoard events (each
    run of the script under the same root is the default logger's next version)."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    from agent.tb_progress import event_files, scalar_of

    out: dict[int, float] = {}
    for path in event_files(root / "lightning_logs" / f"version_{version}"):
        for ev in EventFileLoader(str(path)).Load():
            for v in ev.summary.value:
                if v.tag == "train_loss":
                    value = scalar_of(v)
                    if value is not None:
                        out[ev.step + 1] = value
    return out


def check(run: dict, losses: dict[int, float], first: int, every_step: bool, next_ok: bool = False) -> list[dict]:
    """Steps monotonic, within (first, global_step], the last one the final global_step, one
    train_end at it; each loss the one logged for its step (as the bar rounds it). `next_ok`:
    or the next step's (Rich redraws from a thread of its own: at an epoch's last batch it was seen
    to draw the count before it with the last batch's metrics)."""
    recs = [r for r in run["records"] if r["event"] is None]
    steps = [r["step"] for r in recs]
    assert steps, run["raw"].decode(errors="replace")[-2000:]
    assert steps == sorted(steps), steps
    assert first < steps[0] and steps[-1] == run["global_step"], (steps, run["global_step"])
    ends = [r for r in run["records"] if r["event"] == MetricEvent.TRAIN_END]
    assert [r["step"] for r in ends] == [run["global_step"]]
    if every_step:
        assert sorted(set(steps)) == list(range(first + 1, run["global_step"] + 1))
    with_loss = [r for r in recs if "loss" in r]
    assert with_loss
    for r in with_loss:
        want = [losses[r["step"]]] + ([losses[r["step"] + 1]] if next_ok and r["step"] + 1 in losses else [])
        assert any(r["loss"] == pytest.approx(w, rel=6e-3, abs=1e-3) for w in want), (r["step"], r["loss"], want)
    return recs


@pytest.fixture(scope="module")
def tqdm_runs(tmp_path_factory) -> dict:
    """tqdm's bar: a fresh run stopped mid-epoch at 17 (12 batches an epoch, saves every 5), then
    the same script again to 30, resumed from last.ckpt (step 15) mid-epoch 1."""
    root = tmp_path_factory.mktemp("lt-tqdm")
    common = ["--root-dir", str(root), "--checkpoint-dir", str(root / "ck"), "--save-steps", "5", "--tqdm"]
    first = run_live([*common, "--max-steps", "17"])
    shutil.copytree(root / "ck", root / "ck-at-15")  # for the Rich run below: the same resume point
    resumed = run_live([*common, "--max-steps", "30", "--step-sleep-s", "0.03"])
    return {"root": root, "first": first, "resumed": resumed}


def test_tqdm_bar_fresh_run(tqdm_runs):
    run = tqdm_runs["first"]
    assert b"Epoch 0:" in run["raw"] and b"Epoch 1:" in run["raw"] and b"/5 [" in run["raw"]  # last epoch: 5 left
    recs = check(run, logged_losses(tqdm_runs["root"]), first=0, every_step=True)
    assert run["global_step"] == 17 and recs[-1]["step"] == 17


def test_tqdm_bar_resumed_mid_epoch(tqdm_runs):
    run = tqdm_runs["resumed"]
    assert b"Training: |" in run["raw"] and b"/? [" in run["raw"]  # the resumed epoch: no "Epoch E:", no total
    assert b"Restoring states from the checkpoint path at" in run["raw"]
    assert b"Epoch 2:" in run["raw"] and b"/6 [" in run["raw"]  # the last epoch's total: the 6 steps left
    check(run, logged_losses(tqdm_runs["root"], version=1), first=15, every_step=True)
    assert run["global_step"] == 30


def test_rich_bar_in_a_pipe(tmp_path):
    """Lightning's default where rich is installed: nothing while training, one frame at the end."""
    run = run_live(["--root-dir", str(tmp_path), "--max-steps", "30"])
    assert "━".encode() in run["raw"] and b"Epoch 2/-2" in run["raw"] and b"6/6" in run["raw"]
    assert b"Epoch 0" not in run["raw"] and b"|" not in run["raw"].split(b"max_steps=30")[-1]
    recs = check(run, logged_losses(tmp_path), first=0, every_step=False)
    assert [r["step"] for r in recs] == [30, 30] and "loss" in recs[-1]  # not 2 × 6 + 6 = 18


def test_rich_bar_redrawn_resumed_mid_epoch(tqdm_runs, tmp_path):
    """Rich drawing live (TTY_COMPATIBLE=1, as in a terminal), resumed from step 15 mid-epoch 1."""
    ck = tmp_path / "ck"
    shutil.copytree(tqdm_runs["root"] / "ck-at-15", ck)
    args = ["--root-dir", str(tmp_path), "--checkpoint-dir", str(ck), "--save-steps", "5", "--max-steps", "30"]
    run = run_live([*args, "--step-sleep-s", "0.03"], env={"TTY_COMPATIBLE": "1"})
    assert b"\x1b[" in run["raw"] and b"Epoch 1/-2" in run["raw"] and b"Epoch 2/-2" in run["raw"]
    recs = check(run, logged_losses(tmp_path), first=15, every_step=False, next_ok=True)
    assert len({r["step"] for r in recs}) >= 8  # frames redrawn as it trains, not one at the end


def test_hand_written_tqdm_lines_still_parse():
    """The documented tqdm line (tests/data/logs/lightning.txt): the validation bar is ignored."""
    logs = ROOT / "tests" / "data" / "logs" / "lightning.txt"
    split, parser = SegmentSplitter(), LogParser(preset=byo.PRESET_LIGHTNING)
    recs = [r for seg in split.push(logs.read_bytes() + b"\n") for r in parser.feed(seg, now=1.0)]
    assert [r["step"] for r in recs] == [5, 10, 13]
