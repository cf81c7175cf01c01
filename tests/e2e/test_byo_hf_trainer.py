"""Acceptance 1 of issue 21: an unmodified Hugging Face Trainer script under Aerie.

`examples/byo/hf_train.py` (transformers.Trainer, a tiny GPT-NeoX from a config object, generated
text, `save_steps`, `output_dir` = the checkpoint directory, `resume_from_checkpoint` when one
exists) runs on 2 nodes x 2 ranks (torchrun, gloo) of the local backend with `metrics: hf-trainer`
and `checkpoint.marker: hf-trainer`, against the real control plane and the loopback S3 server:

1. progress comes only from the trainer's log lines (it writes no metrics stream of its own);
2. the agent uploads the trainer's `checkpoint-N/` directories and commits them (good in the API);
3. `aerie chaos JOB --node 0 --rank 1 --fault sigstop` has the node's agent stop the real rank
   process (audited as an event); the agent sees no new step in the log and calls `silent.hang`;
4. attempt 2 restores the last committed checkpoint into every node's directory, the unchanged
   script resumes from it, the job completes, and rank 0's loss curve in the API is continuous.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import psutil
import pytest

from orchestrator.harness.control_plane import ControlPlane
from orchestrator.harness.jobs import FAST_HEALTH
from tests.helpers.wait import wait_for

pytestmark = pytest.mark.slow
pytest.importorskip("accelerate")

REPO = Path(__file__).resolve().parents[2]
STEPS, SAVE = 30, 10


@pytest.fixture
def cp(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    plane = ControlPlane(home, s3=True).start()
    yield plane
    plane.stop()
    plane.cleanup_nodes()


def test_unmodified_hf_trainer_hang_restart_resume(cp, tmp_path):
    spec = {
        "name": "byo-hf",
        "entrypoint": ["python", "examples/byo/hf_train.py"],
        "args": ["--max-steps", str(STEPS), "--save-steps", str(SAVE), "--step-sleep", "0.3"],
        "resources": {"instance_count": 2, "procs_per_node": 2},
        "metrics": "hf-trainer",
        "checkpoint": {"s3_uri": "s3://aerie/byo", "marker": "hf-trainer"},
        "retry": {"max_restarts": 1},
        "health": {**FAST_HEALTH, "startup_grace_s": 10},  # hang after 12 s without a step
        "backend_options": {"workdir": str(REPO)},
        "env": {"TOKENIZERS_PARALLELISM": "false"},
    }
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    cp.cli("submit", str(tmp_path / "spec.json"), check=True)
    job_id = wait_for(what="the job", check=lambda: cp.job("byo-hf")["id"], timeout_s=60)

    def good() -> list[dict]:
        return [c for c in cp.get(f"/v1/jobs/{job_id}/checkpoints") if c["state"] == "good"]

    wait_for(what="a committed checkpoint", check=lambda: good() or None, timeout_s=240)
    cp.cli("chaos", job_id, "--node", "0", "--rank", "1", "--fault", "sigstop", check=True)
    pid_file = next((cp.home / "jobs" / job_id).glob("attempt-1/algo-1/agent/ranks/rank-1.pid"))
    rank1 = psutil.Process(int(pid_file.read_text()))
    wait_for(what="rank 1 stopped by its agent", check=lambda: rank1.status() == psutil.STATUS_STOPPED, timeout_s=20)

    job = cp.wait_state("byo-hf", {"Completed", "Failed"}, timeout_s=300)
    attempts = sorted(cp.get(f"/v1/jobs/{job_id}/attempts"), key=lambda a: a["number"])
    assert job["state"] == "Completed", (job, attempts)
    # The stopped rank's node called the hang from log-derived progress. (The attempt's recorded
    # reason may be a peer's crash instead: the verdict's node ends its ranks, gloo peers on the
    # other node then fail at once, and a poll between the two exits sees only theirs.)
    hangs = [
        v for v in cp.job("byo-hf")["verdicts"] if v["kind"] == "silent.hang" and v["attempt_id"] == attempts[0]["id"]
    ]
    assert hangs and "stopped/gone: ranks [1]" in hangs[0]["message"], cp.job("byo-hf")["verdicts"]
    assert attempts[0]["reason"]["kind"] in ("silent.hang", "exit.nonzero"), attempts[0]
    resumed = attempts[1]["resume_from"]
    assert resumed in {c["uri"] for c in good()}, (resumed, good())
    resume_step = int(resumed.split("step_")[1][:8])
    assert resume_step >= SAVE

    # The curve (the dashboard's series.json: attempt 1's points after the resume step are dropped).
    with httpx.Client(base_url=cp.url) as web:
        web.post("/ui/login", data={"token": cp.token, "next": "/ui/jobs"})
        series = web.get(f"/ui/jobs/{job_id}/series.json").json()
    steps = series["series"]["loss"]["x"]
    assert steps == list(range(1, STEPS + 1)), (steps, series["resumes"])  # every step once, from both attempts, no gap
    assert [r["step"] for r in series["resumes"]] == [resume_step]
    audit = [e["detail"] for e in cp.events("byo-hf") if e["detail-type"] == "Aerie Chaos Injected"]
    assert [(a["host"], a["rank"], a["fault"]) for a in audit] == [("algo-1", 1, "sigstop")]
    # The second attempt really resumed (HF's own bar starts at the restored step, not at 1).
    first_two = sorted(
        json.loads(line)["step"]
        for line in next((cp.home / "jobs" / job_id).glob("attempt-2/*/output/metrics/rank-00000.jsonl"))
        .read_text()
        .splitlines()
    )[0]
    assert first_two == resume_step + 1
