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

import pytest

from tests.helpers.byo_job import ByoScript, hang_restart_resume

pytestmark = pytest.mark.slow
pytest.importorskip("accelerate")

# Long enough that the stop lands mid-training on a loaded host: after the first commit, ~50 steps
# (~20 s) are left, while `aerie chaos` reaches the rank in a few seconds (CI, both cores busy: 8 s,
# when 30 steps left only 6 s and the SIGSTOP hit a rank that had finished and was exiting).
HF = ByoScript("byo-hf", "hf_train.py", steps=60, save_steps=10, step_sleep=0.4)


def test_unmodified_hf_trainer_hang_restart_resume(s3_plane, tmp_path):
    # The shared checks include attempt 2 starting at the restored step (HF's own bar resumes there).
    hang_restart_resume(
        s3_plane,
        HF,
        tmp_path,
        # Hang after 20 s without a step: HF's periodic saves are invisible pauses between steps
        # (the tail after the last step, "N/N", is a wind-down with a limit of its own).
        health={"hang_floor_s": 20},
        metrics="hf-trainer",
        checkpoint={"s3_uri": "s3://aerie/byo", "marker": "hf-trainer"},
        env={"TOKENIZERS_PARALLELISM": "false"},
    )
