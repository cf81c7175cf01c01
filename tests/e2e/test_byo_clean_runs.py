"""Issue 33, acceptance 3 (and 5's "0 false verdicts in 3 clean runs"): no false verdict in clean
runs of unmodified third-party trainers that pause for long without a step, with the real
libraries, three runs each.

Each test runs its three jobs at once (1 node x 1 rank of the local backend, against the real
control plane) and asserts that every job completes with no verdict, and that the pause really
happened, longer than the hang limit it would otherwise meet (the probe's own step times show
it). The health settings are the defaults (a hang after `hang_floor_s` 30 s without a step,
`first_step_timeout_s` 300 s) but for `startup_grace_s` (5 s: the default 60 s would cover the
first minute, where no verdict can be false) and what a test names.

- `examples/byo/hf_train.py`: HF Trainer with `eval_strategy="steps"`, `eval_steps=50`: a
  60-second evaluation (80 rows of an evaluation set on slow storage, 0.75 s a row) at step 50,
  and (HF's default) another one at the end of training, before its final save. The in-process
  probe sees forwards with no backward and opens an eval section.
- `examples/byo/ddp_train.py`: a loop that saves synchronously with `torch.save` for 45 s (its
  `SlowDisk` file object paces the writes as slow storage would: a stand-in for a large state,
  which cannot be written here in a test's time). The probe opens a checkpoint section inside
  `torch.save`.
- `examples/byo/lightning_train.py`: a stock Lightning script resumed mid-epoch (its attempt 1 is
  SIGKILLed by `aerie chaos` after the agent committed a `last.ckpt` mid-epoch), with an epoch
  longer than `first_step_timeout_s`. Lightning's Rich bar prints nothing until the epoch ends, so
  only the probe's steps say the resumed attempt is training. `first_step_timeout_s` is 45 s and
  `section_factor` 1.5, so the resumed attempt's setup limit (learned from attempt 1's setup) stays
  at 45 s, under the 54 to 72 s rest of the epoch. (The same gaps without the probe's events are
  hangs: tests/agent/test_clean_runs.py's control.)
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from aerie_contracts import byo
from aerie_contracts.metrics import MetricEvent
from devtools.harness.control_plane import ControlPlane
from devtools.harness.jobs import served_by
from tests.helpers.byo_job import REPO, ByoScript, byo_spec
from tests.helpers.wait import wait_for

pytestmark = pytest.mark.slow

RUNS = 3
CLEAN_HEALTH = {"startup_grace_s": 5, "heartbeat_s": 2}


def clean_spec(run: ByoScript, name: str, health: dict | None = None, **more: Any) -> dict[str, Any]:
    """`run`'s job as `name`, 1 node x 1 rank, default health settings but CLEAN_HEALTH and `health`."""
    spec = byo_spec(run, **more)
    spec.update(
        name=name,
        resources={"instance_count": 1, "procs_per_node": 1},
        health={**CLEAN_HEALTH, **(health or {})},
        backend_options={"workdir": str(REPO)},
    )
    return spec


def submit_runs(cp: ControlPlane, work: Path, run: ByoScript, **spec_keys: Any) -> list[str]:
    """RUNS jobs of `run` at once; their names."""
    names = [f"{run.name}-{i}" for i in range(1, RUNS + 1)]
    for name in names:
        path = work / f"{name}.json"
        path.write_text(json.dumps(clean_spec(run, name, **spec_keys)))
        cp.submit(path, name)
    return names


def wait_clean(cp: ControlPlane, names: list[str], timeout_s: float) -> list[dict]:
    """Every job of `names` ended Completed with no verdict at all; the jobs."""
    jobs = [cp.wait_state(name, {"Completed", "Failed"}, timeout_s=timeout_s) for name in names]
    for job in jobs:
        job = cp.job(job["id"])
        assert job["state"] == "Completed" and not job["verdicts"], (
            job["name"],
            job["state"],
            [(a["number"], a["state"], a.get("reason")) for a in job["attempt_list"]],
            job["verdicts"],
        )
    return jobs


def probe_records(cp: ControlPlane, job_id: str, attempt: int = 1) -> list[dict]:
    """Rank 0's stream of `attempt` (relaunched or in place) as the in-process probe wrote it
    (steps and events). An in-place attempt runs under the directory of the attempt that launched
    the agents, which set the group's stream before aside as `output/metrics.attempt-<n>`."""
    root = next(d for d in (cp.home / "jobs" / job_id).glob("attempt-*") if attempt in served_by(d))
    metrics = "metrics" if attempt == served_by(root)[-1] else f"metrics.attempt-{attempt}"
    stream = root / "algo-1" / "output" / metrics / "rank-00000.jsonl"
    records = [json.loads(line) for line in stream.read_text().splitlines() if line.strip()]
    return [r for r in records if r.get(byo.SOURCE_KEY) == byo.SOURCE_PROBE]


def longest_gap(records: list[dict]) -> tuple[float, int]:
    """The longest time between two consecutive step records, and the step after it."""
    steps = [(r["t"], r["step"]) for r in records if r.get("step") and not r.get("event")]
    return max((b[0] - a[0], b[1]) for a, b in itertools.pairwise(steps))


def events_before(records: list[dict], step: int) -> list[str]:
    """The probe's events (sections) before `step`'s record."""
    until = next(r["t"] for r in records if r.get("step") == step and not r.get("event"))
    return [r["event"] for r in records if r.get("event") and r["t"] <= until]


HF = ByoScript(
    "clean-hf",
    "hf_train.py",
    steps=60,
    save_steps=1000,  # no checkpoint: the pause under test is the evaluation
    step_sleep=0.1,
    args=("--eval-steps", "50", "--eval-rows", "80", "--eval-read-s", "0.75"),
)


def test_hf_trainer_with_a_60_second_evaluation_every_50_steps(s3_plane, tmp_path):
    names = submit_runs(s3_plane, tmp_path, HF, metrics="hf-trainer", env={"TOKENIZERS_PARALLELISM": "false"})
    for job in wait_clean(s3_plane, names, timeout_s=420):
        records = probe_records(s3_plane, job["id"])
        gap, after = longest_gap(records)
        assert gap >= 60 and after == 51, (gap, after)  # the evaluation, longer than the 30-s hang floor
        seen = events_before(records, 51)
        assert seen == [MetricEvent.EVAL_BEGIN.value, MetricEvent.EVAL_END.value], seen
        # HF's final save went to the node's own directory (the agent's AERIE_CHECKPOINT_DIR, with
        # no checkpoint sync in the spec), never to the host's /opt/ml/checkpoints, where the next
        # job's HF would find it and resume from it (as one did before the agent always set it).
        assert (s3_plane.home / "jobs" / job["id"] / "attempt-1/algo-1/checkpoints/checkpoint-60").is_dir()


SAVE = ByoScript("clean-save", "ddp_train.py", steps=30, save_steps=20, step_sleep=0.1, args=("--save-seconds", "45"))


def test_a_loop_that_saves_synchronously_with_torch_save_for_45_seconds(s3_plane, tmp_path):
    names = submit_runs(
        s3_plane, tmp_path, SAVE, checkpoint={"s3_uri": "s3://aerie/clean-save", "marker": "ckpt-*/DONE"}
    )
    for job in wait_clean(s3_plane, names, timeout_s=480):
        records = probe_records(s3_plane, job["id"])
        gap, after = longest_gap(records)
        assert gap >= 45 and after == 21, (gap, after)  # the save at step 20, longer than the hang floor
        seen = events_before(records, 21)
        assert seen[:2] == [MetricEvent.CHECKPOINT_BEGIN.value, MetricEvent.CHECKPOINT_END.value], seen


# 150 steps an epoch (1,200 samples, batch 8) of 0.6 s: a save every 30 steps, so attempt 2
# resumes at step 30 or 60, with 54 to 72 s of the epoch left.
LIGHTNING = ByoScript(
    "clean-lightning",
    "lightning_train.py",
    steps=160,
    save_steps=30,
    step_sleep=0.6,
    args=("--samples", "1200"),
)
EPOCH_STEPS = 150
FIRST_STEP_TIMEOUT_S = 45  # attempt 1's own setup (to step 1) takes 8 s on a quiet host, 3x that loaded


def test_lightning_resumed_mid_epoch_with_an_epoch_longer_than_the_first_step_timeout(s3_plane, tmp_path):
    names = submit_runs(
        s3_plane,
        tmp_path,
        LIGHTNING,
        health={"first_step_timeout_s": FIRST_STEP_TIMEOUT_S, "section_factor": 1.5},
        metrics="lightning",
        checkpoint={"s3_uri": "s3://aerie/clean-lightning", "marker": "lightning"},
        retry={"max_restarts": 1},
    )
    ids = [s3_plane.job(name)["id"] for name in names]
    for job_id in ids:  # each job's attempt 1 dies mid-epoch once a checkpoint is committed
        wait_for(
            what=f"a committed checkpoint of {job_id}",
            check=lambda job_id=job_id: (
                [c for c in s3_plane.get(f"/v1/jobs/{job_id}/checkpoints") if c["state"] == "good"] or None
            ),
            timeout_s=240,
        )
        s3_plane.cli("chaos", job_id, "--node", "0", "--rank", "0", "--fault", "sigkill", check=True)
    for job in wait_clean(s3_plane, names, timeout_s=480):
        attempts = sorted(s3_plane.get(f"/v1/jobs/{job['id']}/attempts"), key=lambda a: a["number"])  # type: ignore[arg-type]
        assert len(attempts) == 2, attempts
        resumed = probe_records(s3_plane, job["id"], attempt=2)
        first = min(r["step"] for r in resumed if r.get("step"))
        assert (first - 1) % EPOCH_STEPS > 0, first  # mid-epoch
        epoch_left_s = next(r["t"] for r in resumed if r.get("step") == EPOCH_STEPS) - resumed[0]["t"]
        assert epoch_left_s > FIRST_STEP_TIMEOUT_S, epoch_left_s  # the epoch's rest outlasted the timeout
