"""Issue 33: a trainer with its own checkpoint directory restarts in place, on the same nodes, and
finds its checkpoint where it left it.

`examples/byo/ddp_train.py` (plain DDP, `torch.save` into `ckpt-N/` with `DONE` written last, the
spec's marker glob `ckpt-*/DONE`; it resumes from the newest complete `ckpt-N` in its directory)
on 2 nodes x 2 ranks of the local backend with the loopback S3 server. Once a checkpoint is
committed and rank 0 trained past it, the test plants a newer complete-looking `ckpt-999/` in
algo-1's directory, as a failed attempt leaves a save Aerie never committed (the test keeps touching
it, so the agent never finds it settled and never uploads it), and `aerie chaos` SIGKILLs rank 1.
The nodes are healthy, so the next attempt is in place: algo-1 keeps the committed checkpoint
(nothing downloaded: "kept in place" in its node log), `ckpt-999` is moved to `.aerie-aside/`
and never resumed from (the script would crash on its empty files), algo-2 restores the
checkpoint from S3, attempt 2's first step is the one after it, and the job completes.
"""

from __future__ import annotations

import json
import os
import threading
import time

import pytest

from aerie_contracts.checkpoints import step_of_uri
from devtools.harness.jobs import attempt_step_records
from tests.helpers.byo_job import ByoScript, _logged_steps, byo_spec
from tests.helpers.wait import wait_for

# In the jobs phase, not beside the unit tests: an in-place restart takes the warm worker group,
# which imports torch on idle CPU time only, and two busy xdist workers leave it none.
pytestmark = pytest.mark.slow

# Saves every 20 steps (6 s) and 25 s of training after the first: the kill lands mid-training on a
# loaded host (`aerie chaos` reaches the rank at the agent's next tick).
DDP = ByoScript("byo-in-place", "ddp_train.py", steps=90, save_steps=20, step_sleep=0.3)
METRIC_DEFINITIONS = [
    {"Name": "step", "Regex": r"^step (\d+)/\d+ \|"},
    {"Name": "train:loss", "Regex": r"\| loss ([0-9.eE+-]+|nan|inf) \|"},
]


def _keep_unsettled(path, stop: threading.Event) -> None:
    """Touch `path` until it is gone (set aside) or `stop`: the agent sees it change, never settle."""
    while not stop.is_set():
        try:
            os.utime(path)
        except FileNotFoundError:
            return
        time.sleep(0.2)


def test_an_own_directory_trainer_restarts_in_place_and_never_resumes_an_uncommitted_save(s3_plane, tmp_path):
    cp = s3_plane
    spec = byo_spec(
        DDP, metrics=METRIC_DEFINITIONS, checkpoint={"s3_uri": "s3://aerie/byo-in-place", "marker": "ckpt-*/DONE"}
    )
    spec["args"] += ["--keep", "10"]  # its rotation would count the planted ckpt-999 among the newest
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    job_id = cp.submit(tmp_path / "spec.json", DDP.name)

    def good() -> list[dict]:
        return [c for c in cp.get(f"/v1/jobs/{job_id}/checkpoints") if c["state"] == "good"]  # type: ignore[union-attr]

    committed = wait_for(what="a committed checkpoint", check=lambda: good() or None, timeout_s=240)
    newest = max(step_of_uri(c["uri"]) or 0 for c in committed)
    wait_for(
        what=f"rank 0 past step {newest}",
        check=lambda: _logged_steps(cp, job_id, 1) > newest,
        timeout_s=60,
        every_s=0.1,
    )

    node = cp.home / "jobs" / job_id / "attempt-1" / "algo-1"
    planted = node / "checkpoints" / "ckpt-999"
    planted.mkdir()
    (planted / "model.pt").write_bytes(b"")  # torch.load of it would fail: resuming from it crashes
    (planted / "DONE").write_text("")
    stop = threading.Event()
    toucher = threading.Thread(target=_keep_unsettled, args=(planted / "model.pt", stop), daemon=True)
    toucher.start()
    try:
        cp.cli("chaos", job_id, "--node", "0", "--rank", "1", "--fault", "sigkill", check=True)
        job = cp.wait_state(DDP.name, {"Completed", "Failed"}, timeout_s=300)
    finally:
        stop.set()
    attempts = job["attempt_list"]
    story = [
        (a["number"], a["state"], (a.get("cause") or {}).get("mode"), a.get("reason"), a.get("resume_from"))
        for a in attempts
    ]
    assert job["state"] == "Completed", story
    assert len(attempts) == 2 and attempts[1]["cause"]["mode"] == "in_place", story
    resumed = attempts[1]["resume_from"]
    assert resumed in {c["uri"] for c in good()} and step_of_uri(resumed) != 999, story
    every = cp.get(f"/v1/jobs/{job_id}/checkpoints")
    assert all(step_of_uri(c["uri"]) != 999 for c in every), every  # type: ignore[union-attr]

    # The uncommitted save was set aside, whole, and the committed one kept where the trainer left it.
    aside = node / "checkpoints" / ".aerie-aside" / "attempt-1"
    assert (aside / "ckpt-999" / "DONE").exists(), sorted(p.name for p in (node / "checkpoints").rglob("*"))
    resume_dir = f"ckpt-{step_of_uri(resumed)}"
    assert (node / "checkpoints" / resume_dir / "DONE").exists()
    log_1 = (node / "logs" / "node.log").read_text(errors="replace")
    log_2 = (cp.home / "jobs" / job_id / "attempt-1" / "algo-2" / "logs" / "node.log").read_text(errors="replace")
    assert f"kept in place in {node / 'checkpoints' / resume_dir}" in log_1, log_1[-3000:]
    assert f"restored {resumed}" in log_2, log_2[-3000:]  # algo-2's rank saves nothing: from S3

    second = attempt_step_records(cp.home / "jobs" / job_id, 2, rank=0)
    assert second and min(r["step"] for r in second) == step_of_uri(resumed) + 1, second[:3]
