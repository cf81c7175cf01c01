"""Issue 33, acceptance 1 for PyTorch Lightning: a stock Lightning script under Aerie, nothing
configured for its logging.

`examples/byo/lightning_train.py` as its users write it: Lightning's default progress bar (Rich,
which prints one frame when its output is a pipe), `ModelCheckpoint(dirpath=..., every_n_train_steps,
save_last=True)` writing flat `epoch=E-step=S.ckpt` files and `last.ckpt`, `trainer.fit(...,
ckpt_path="last")`, DDP over gloo on 2 nodes x 2 ranks (`--devices 2 --num-nodes 2`; under
torchrun Lightning takes the ranks torchrun started). With `metrics: lightning` and
`checkpoint.marker: lightning`, against the real control plane and the loopback S3 server,
`tests.helpers.byo_job.hang_restart_resume` shows: each rank's steps reach the API (the in-process
probe's records: the bar alone would say nothing until the end), a SIGSTOP of rank 1 on node 0 is
`silent.hang` whose evidence names the stopped rank and its frame (read by py-spy), the job
restarts, Lightning resumes from the committed `last.ckpt` restored into its directory, and
completes with every step once in the loss curve.
"""

from __future__ import annotations

import pytest

from tests.helpers.byo_job import ByoScript, every_rank_in_the_api, hang_restart_resume

pytestmark = pytest.mark.slow
pytest.importorskip("lightning")

# 6 steps an epoch (96 samples, batch 8, 2 data-parallel replicas): a resume lands mid-epoch.
LIGHTNING = ByoScript(
    "byo-lightning",
    "lightning_train.py",
    steps=90,
    save_steps=30,
    step_sleep=0.4,
    args=("--devices", "2", "--num-nodes", "2"),
)


def test_stock_lightning_script_hang_restart_resume(s3_plane, tmp_path):
    run = hang_restart_resume(
        s3_plane,
        LIGHTNING,
        tmp_path,
        steps_from_probe=True,
        while_training=every_rank_in_the_api,
        metrics="lightning",
        checkpoint={"s3_uri": "s3://aerie/byo-lightning", "marker": "lightning"},
    )
    hangs = [v for v in s3_plane.job(LIGHTNING.name)["verdicts"] if v["kind"] == "silent.hang"]
    described = s3_plane.cli("describe", run.job_id, check=True).stdout
    assert "rank 1: stopped" in described and "lightning_train.py" in described, described
    assert hangs, hangs
    # Acceptance 5: the learned limit for a stopped rank, max(stopped_floor_s 10 s, 5 x p95 of the
    # step), not the 12 s hang floor of these tests' health settings.
    ev = hangs[0]["evidence"]
    assert ev["limit_s"] == pytest.approx(max(10.0, 5 * ev["step_time_p95"]), abs=0.01), ev["limit_s"]
