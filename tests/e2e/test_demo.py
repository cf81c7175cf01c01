"""`make demo` end to end (what `python -m orchestrator.demo` does), on a fresh AERIE_HOME.

It must tell the whole story on the embedded defaults: train the tiny model on 2 local nodes (and a
hot spare) with checkpoints to the loopback S3 server and to memory; catch the injected silent hang
and restart **in place** from the memory checkpoint; lose a whole node (`aerie chaos --fault
node-loss`) and go on in place with the spare in its slot, its ranks restored from the replicas the
peer holds; finish; print each root cause first and what each recovery cost. The model must learn
(loss at the end < 60 % of the loss at step 10) with every TensorBoard scalar written. Its output
goes to a pipe with no COLUMNS, as in a CI log: every table header must be whole (issue #37).
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from aerie_contracts.restarts import CAUSE_MODE, CAUSE_REPLACED_NODES, RestartMode
from devtools.harness.jobs import rank_losses

REPO = Path(__file__).resolve().parents[2]
SCALARS = {"loss", "grad_norm", "lr", "tokens_per_s", "mfu", "tokens_per_dollar"}

pytestmark = pytest.mark.slow


def test_make_demo_tells_the_whole_story(tmp_path):
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AERIE_", "AWS_"))}
    env.pop("COLUMNS", None)
    env.update({"AERIE_HOME": str(home), "AERIE_PORT": "0"})
    started = time.time()
    try:
        r = subprocess.run(
            [sys.executable, "-m", "orchestrator.demo"], cwd=REPO, env=env, capture_output=True, text=True, timeout=900
        )
    finally:
        subprocess.run(
            [sys.executable, "-m", "devtools.devstack", "down"], cwd=REPO, env=env, capture_output=True, timeout=60
        )
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-6000:]
    elapsed = time.time() - started
    assert "verdict silent.hang" in out, out[-6000:]
    assert "--- attempt 2 ---" in out and "--- attempt 3 ---" in out, out[-6000:]
    # The root cause first: the blamed node (algo-1, whose rank spun), not the peer that reported first.
    assert "root cause: silent.hang on algo-1" in out, out[-6000:]
    assert "root cause: node.lost on algo-2" in out, out[-6000:]
    assert "resumed from mem://" in out, out[-6000:]
    # The spare (algo-3) restores the lost node's ranks from the replicas algo-1 holds.
    assert "rank 2: restoring from the replica copy" in out and "rank 3: restoring from the replica copy" in out
    assert "attempt 1: silent.hang on algo-1 -> attempt 2 in place" in out, out[-6000:]
    assert "attempt 2: node.lost on algo-2 -> attempt 3 in place (algo-3 took algo-2's slot)" in out
    assert "from detection to the first step" in out and "step(s) redone" in out
    assert "Completed" in out
    # `aerie checkpoints` (the demo runs it at the end) lists the committed checkpoints as good.
    assert "good" in out and "s3://aerie/checkpoints/" in out
    # With stdout a pipe, tables are as wide as their content: no header cut short.
    headers = [line for line in out.splitlines() if line.startswith("┃")]
    assert any("┃ ATTEMPT ┃ STATE" in h and "RESUMED FROM" in h for h in headers), headers
    assert not [h for h in headers if "…" in h], headers
    assert elapsed < 600, f"the demo took {elapsed:.0f}s"
    print(f"demo took {elapsed:.0f}s")

    # The attempts' modes, as the store recorded them: in place after the hang, in place with the
    # spare after the node loss, each from a memory checkpoint.
    with sqlite3.connect(home / "aerie.db") as db:
        rows = db.execute("SELECT number, cause, resume_from FROM attempts ORDER BY number").fetchall()
    causes = {n: json.loads(c) if c else {} for n, c, _ in rows}
    resumed = {n: r for n, _, r in rows}
    assert sorted(causes) == [1, 2, 3], causes
    assert causes[2][CAUSE_MODE] == RestartMode.IN_PLACE and not causes[2].get(CAUSE_REPLACED_NODES), causes[2]
    assert causes[3][CAUSE_MODE] == RestartMode.IN_PLACE, causes[3]
    assert causes[3][CAUSE_REPLACED_NODES] == {"algo-2": "algo-3"}, causes[3]
    assert resumed[2].startswith("mem://") and resumed[3].startswith("mem://"), resumed

    job_dir = next((home / "jobs").iterdir())
    losses = rank_losses(home / "jobs", job_dir.name)
    stitched = {**losses[1], **losses[2], **losses[3]}
    assert max(stitched) == 300
    assert stitched[300] < 0.6 * stitched[10], (stitched[10], stitched[300])

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tags = set()
    for events in job_dir.glob("attempt-*/algo-*/output/tensorboard"):  # rank 0's node moves with blame
        acc = EventAccumulator(str(events))
        acc.Reload()
        tags |= set(acc.Tags()["scalars"])
    assert tags >= SCALARS, tags
