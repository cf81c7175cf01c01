"""bench/chaos.py's recovery timings (devtools/harness/recovery.py), from metrics streams laid
out as the agents write them: an in-place successor's stream beside the set-aside one of the
attempt before, in the directory of the attempt that launched the agents."""

from __future__ import annotations

import json
import time
from pathlib import Path

from aerie_contracts.checkpoints import memory_uri
from aerie_contracts.metrics import MetricEvent
from devtools.harness.recovery import FAULTS, PolicyRun, measure

T0 = 1_000_000.0


def _stream(path: Path, records: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def test_an_in_place_restart_is_timed_from_the_two_streams(tmp_path):
    job_dir = tmp_path / "job"
    launched = job_dir / "attempt-1"
    (launched / "handle-2.json").parent.mkdir(parents=True)
    (launched / "handle-2.json").write_text("{}")
    # Attempt 1: steps 1-26 at 0.5 s, a snapshot every 5 steps costing 0.01 s; the rank dies before 27.
    first = [{"t": T0 + 0.5 * s, "step": s, "loss": 5.0, "step_s": 0.5, "rank": 0} for s in range(1, 27)]
    first += [
        {"t": T0 + 0.5 * s, "step": s, "event": MetricEvent.CHECKPOINT_MEMORY, "snapshot_s": 0.01} for s in (5, 10)
    ]
    _stream(launched / "algo-1" / "output" / "metrics.attempt-1" / "rank-00000.jsonl", first)
    failed_at = T0 + 13.0 + 2.0  # two seconds after step 26
    uri = memory_uri("job", 25, 1)
    # Attempt 2 in place: ranks begin restoring 1.5 s after the verdict, restore for 0.25 s.
    second = [
        {"t": failed_at + 1.75, "step": 25, "event": MetricEvent.RESTORED, "uri": uri, "restore_s": 0.25, "rank": r}
        for r in (0, 1)
    ]
    second += [{"t": failed_at + 2 + 0.5 * i, "step": 25 + i, "loss": 5.0, "step_s": 0.5, "rank": 0} for i in (1, 2)]
    _stream(launched / "algo-1" / "output" / "metrics" / "rank-00000.jsonl", second[:1] + second[2:])
    _stream(launched / "algo-1" / "output" / "metrics" / "rank-00001.jsonl", second[1:2])
    job = {
        "state": "Completed",
        "attempt_list": [
            {"number": 1, "ended_at": failed_at, "reason": {"kind": "exit.nonzero"}},
            {"number": 2, "resume_from": uri, "cause": {"mode": "in_place"}},
        ],
    }

    def stamp(t: float) -> str:  # as the agent's logging writes it (local time, milliseconds)
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) + f",{round(t % 1 * 1000):03d}"

    log = [
        f"[agent {stamp(failed_at - 5)}] INFO starting 2 rank(s) on algo-1: python -m trainer.train",
        f"[agent {stamp(failed_at + 0.5)}] INFO node algo-1 finished: exit 137 {{}}",
        f"[agent {stamp(failed_at + 0.75)}] INFO node algo-1 restarts its worker group in place for job-a2",
        f"[agent {stamp(failed_at + 1.0)}] INFO starting 2 rank(s) on algo-1 (warm: torch already imported): x",
        f"[algo-1 rank 0] {stamp(failed_at + 1.25)} INFO trainer.train: process group: 4 ranks",
    ]
    (launched / "algo-1" / "logs").mkdir(parents=True)
    (launched / "algo-1" / "logs" / "node.log").write_text("\n".join(log) + "\n")
    run = PolicyRun(policy="in place + memory", job=job, wall_s=30.0)
    measure(run, job_dir)
    assert run.faults[0]["phases"] == {
        "reaped": 0.5,
        "learned": 0.75,
        "spawned": 1.0,
        "pg_init": 1.25,
        "restored": 1.75,
        "first_step": 2.5,
    }
    assert run.median_step_s == 0.5
    assert run.snapshot_share == 0.02 / (0.5 * 28)
    [fault] = run.faults
    assert fault["fault"] == FAULTS[0]["kind"] and fault["mode"] == "in_place"
    assert fault["detect_s"] == 2.0
    assert fault["restart_s"] == 1.5 and fault["restore_s"] == 0.25 and fault["restart_plus_restore_s"] == 1.75
    assert fault["resumed_step"] == 25 and fault["redone_steps"] == 1 and fault["redone_s"] == 0.5
