"""The bring-your-own-trainer rehearsal shared by tests/e2e/test_byo_*.py.

`hang_restart_resume` submits a third-party trainer's spec (2 nodes x 2 ranks, one restart
allowed) to a control plane with the loopback S3 server, waits for the agent to commit one of the
trainer's own checkpoints, has `aerie chaos` SIGSTOP rank 1 on node 0, waits for the job to end,
and checks what every such script must show: `silent.hang` from log-derived progress on the
stopped rank's node, attempt 2 resumed from a committed checkpoint, rank 0's loss curve in the
dashboard has every step once (no gap), the chaos request audited, and attempt 2's first step
is the one after the resumed checkpoint's. The caller adds what is particular to its script.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil

from aerie_contracts import byo
from aerie_contracts.health import SUMMARY_RANK_STEPS
from devtools.harness.control_plane import ControlPlane
from devtools.harness.jobs import FAST_HEALTH, attempt_step_records
from tests.helpers.wait import wait_for

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class ByoScript:
    """A job of `examples/byo/<script>` and its schedule (the script's --max-steps, --save-steps and
    --step-sleep)."""

    name: str
    script: str
    steps: int
    save_steps: int
    step_sleep: float
    args: tuple[str, ...] = ()  # the script's own further arguments


def byo_spec(run: ByoScript, health: dict | None = None, **more: Any) -> dict[str, Any]:
    """The spec of `run` on 2 nodes x 2 ranks of the local backend, one restart allowed, the fast
    health thresholds (a hang after 12 s without a step, `health` overriding); `more` adds the
    script's own keys (metrics, checkpoint, env)."""
    return {
        "name": run.name,
        "entrypoint": ["python", f"examples/byo/{run.script}"],
        "args": [
            "--max-steps",
            str(run.steps),
            "--save-steps",
            str(run.save_steps),
            "--step-sleep",
            str(run.step_sleep),
            *run.args,
        ],
        "resources": {"instance_count": 2, "procs_per_node": 2},
        "retry": {"max_restarts": 1},
        "health": {**FAST_HEALTH, "startup_grace_s": 10, **(health or {})},
        "backend_options": {"workdir": str(REPO)},
        **more,
    }


@dataclass
class ByoRun:
    job_id: str
    attempts: list[dict[str, Any]]
    resume_step: int
    series: dict[str, Any]  # the dashboard's series.json

    def rank0_steps(self, cp: ControlPlane, attempt: int, probe: bool = False) -> list[dict[str, Any]]:
        """Rank 0's step records of one attempt (relaunched or in place) that the agent parsed from
        its log (the in-process probe writes the same stream: its records, a rank's own local
        loss, left out unless `probe`)."""
        return attempt_step_records(cp.home / "jobs" / self.job_id, attempt, rank=0, probe=probe)


def hang_restart_resume(
    cp: ControlPlane,
    run: ByoScript,
    work: Path,
    steps_from_probe: bool = False,
    while_training: Callable[[ControlPlane, str], None] | None = None,
    **spec_keys: Any,
) -> ByoRun:
    """The rehearsal of `run`'s job (`byo_spec(run, **spec_keys)`), checked as the module says.
    `steps_from_probe`: the script's log says nothing per step (Rich's bar in a pipe): its steps
    are the in-process probe's. `while_training(cp, job_id)` runs once attempt 1 has committed a
    checkpoint and trained past it, before the stop."""
    spec = byo_spec(run, **spec_keys)
    name, steps, save_steps = run.name, run.steps, run.save_steps
    (work / "spec.json").write_text(json.dumps(spec))
    job_id = cp.submit(work / "spec.json", name)

    def good() -> list[dict]:
        return [c for c in cp.get(f"/v1/jobs/{job_id}/checkpoints") if c["state"] == "good"]  # type: ignore[union-attr]

    committed = wait_for(what="a committed checkpoint", check=lambda: good() or None, timeout_s=240)
    # Attempt 1 must have trained past the checkpoint attempt 2 resumes from, so the callers can
    # compare both attempts' loss at the step after it: on a loaded host the commit can land before
    # rank 0 logs that step, and the hang then stopped it short (CI: `31 in first` failed).
    newest = max(_step_of(c["uri"]) for c in committed)
    wait_for(
        what=f"rank 0 of attempt 1 past step {newest}",
        check=lambda: _logged_steps(cp, job_id, 1) > newest,
        timeout_s=60,
        every_s=0.1,
    )
    if while_training is not None:
        while_training(cp, job_id)
    cp.cli("chaos", job_id, "--node", "0", "--rank", "1", "--fault", "sigstop", check=True)
    pid_file = next((cp.home / "jobs" / job_id).glob("attempt-1/algo-1/agent/ranks/rank-1.pid"))
    rank1 = psutil.Process(int(pid_file.read_text()))
    wait_for(what="rank 1 stopped by its agent", check=lambda: rank1.status() == psutil.STATUS_STOPPED, timeout_s=20)

    job = cp.wait_state(name, {"Completed", "Failed"}, timeout_s=300)
    attempts = sorted(cp.get(f"/v1/jobs/{job_id}/attempts"), key=lambda a: a["number"])  # type: ignore[arg-type]
    # Short first (a CI log keeps only the head and tail of a failure): each attempt's end and reason.
    story = [(a["number"], a["state"], (a.get("cause") or {}).get("mode"), a.get("reason")) for a in attempts]
    assert job["state"] == "Completed", f"{job['state']}: {story!s:.1500} | verdicts: {job.get('verdicts')!s:.800}"
    # The stopped rank's node called the hang from log-derived progress. (The attempt's recorded
    # reason may be a peer's crash instead: the verdict's node ends its ranks, gloo peers on the
    # other node then fail at once, and a poll between the two exits sees only theirs.)
    verdicts = cp.job(name)["verdicts"]
    hangs = [v for v in verdicts if v["kind"] == "silent.hang" and v["attempt_id"] == attempts[0]["id"]]
    assert hangs and "stopped/gone: ranks [1]" in hangs[0]["message"], verdicts
    assert attempts[0]["reason"]["kind"] in ("silent.hang", "exit.nonzero"), attempts[0]
    resumed = attempts[1]["resume_from"]
    assert resumed in {c["uri"] for c in good()}, (resumed, good())
    resume_step = _step_of(resumed)
    assert resume_step >= save_steps

    # The curve (the dashboard's series.json: attempt 1's points after the resume step are dropped).
    with httpx.Client(base_url=cp.url) as web:
        web.post("/ui/login", data={"token": cp.token, "next": "/ui/jobs"})
        series = web.get(f"/ui/jobs/{job_id}/series.json").json()
    xs = series["series"]["loss"]["x"]
    assert xs == list(range(1, steps + 1)), (xs, series["resumes"])  # every step once, from both attempts, no gap
    assert [r["step"] for r in series["resumes"]] == [resume_step]
    audit = [e["detail"] for e in cp.events(name) if e["detail-type"] == "Aerie Chaos Injected"]
    assert [(a["host"], a["rank"], a["fault"]) for a in audit] == [("algo-1", 1, "sigstop")]
    result = ByoRun(job_id=job_id, attempts=attempts, resume_step=resume_step, series=series)
    # Attempt 2 really resumed: its first step is the one after the restored checkpoint's.
    assert min(r["step"] for r in result.rank0_steps(cp, 2, probe=steps_from_probe)) == resume_step + 1
    return result


def _step_of(uri: str) -> int:
    """The training step in a committed checkpoint's URI (`.../step_00000030`)."""
    return int(uri.split("step_")[1][:8])


def _logged_steps(cp: ControlPlane, job_id: str, attempt: int) -> int:
    """The newest step rank 0 of `attempt` logged so far (0 before its metrics stream exists)."""
    steps = [0]
    for path in (cp.home / "jobs" / job_id).glob(f"attempt-{attempt}/*/output/metrics/rank-00000.jsonl"):
        for line in path.read_text().splitlines():
            try:
                steps.append(int(json.loads(line).get("step") or 0))
            except (ValueError, AttributeError):
                continue  # a line still being written
    return max(steps)


API_WITHIN_S = 5.0  # acceptance 1: each rank's step and loss are in the API this soon after the step


def every_rank_in_the_api(cp: ControlPlane, job_id: str, watch_s: float = 6.0) -> None:
    """For `watch_s`, every 0.5 s: each rank's newest step in the API (the nodes' heartbeat summary,
    `rank_steps`). Then, from each rank's own stream (the probe's records, with their times): at
    each look, every step taken over API_WITHIN_S before it was shown, with a loss."""
    looks: list[tuple[float, str, dict]] = []
    deadline = time.time() + watch_s
    while time.time() < deadline:
        job = cp.get(f"/v1/jobs/{job_id}")
        first = next(a for a in job["attempt_list"] if a["number"] == 1)  # type: ignore[index]
        for node in first["nodes"]:
            looks.append((time.time(), node["host"], (node.get("summary") or {}).get(SUMMARY_RANK_STEPS) or {}))
        time.sleep(0.5)
    root = cp.home / "jobs" / job_id / "attempt-1"
    for host in ("algo-1", "algo-2"):
        for stream in (root / host / "output" / "metrics").glob("rank-*.jsonl"):
            rank = str(int(stream.stem.split("-")[1]))
            records = [json.loads(line) for line in stream.read_text().splitlines() if line.strip()]
            taken = {r["step"]: r["t"] for r in records if r.get(byo.SOURCE_KEY) == byo.SOURCE_PROBE and r.get("step")}
            for at, seen_host, ranks in looks:
                due = [s for s, t in taken.items() if t <= at - API_WITHIN_S]
                if seen_host != host or not due:
                    continue
                shown = ranks.get(rank)
                assert shown and shown["step"] >= max(due) and shown["loss"] is not None, (
                    host,
                    rank,
                    at,
                    shown,
                    max(due),
                )
