"""`aerie export CHECKPOINT --to hf OUT` on a real trainer checkpoint, loaded back by transformers."""

from __future__ import annotations

import subprocess
import sys

import torch

from tests.helpers.tiny_trainer import REPO, train, trainer_env, write_tiny_config


def test_export_of_a_trained_checkpoint_loads_in_transformers(tmp_path):
    from transformers import AutoModelForCausalLM

    from trainer.eval_sampler import load_weights
    from trainer.models import build_model, get_preset

    cache = tmp_path / "cache"
    config = write_tiny_config(
        tmp_path / "config.yaml",
        cache,
        micro_batch_size=2,
        steps=3,
        instance_type="c7i.xlarge",
        checkpoint={"async": False},
    )
    ckpt = tmp_path / "ckpt"
    env = trainer_env(tmp_path, AERIE_CHECKPOINT_URI=f"file://{ckpt}", AERIE_CHECKPOINT_EVERY="3")
    run = train(config, env)
    assert run.returncode == 0, run.stderr[-3000:]
    step_dir = ckpt / "step_00000003"
    assert (step_dir / "manifest.json").exists()

    out = tmp_path / "hf"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "orchestrator.cli",
            "export",
            str(step_dir),
            str(out),
            "--to",
            "hf",
            "--config",
            str(config),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in out.iterdir()}

    ours = build_model(get_preset("pythia-tiny"))
    load_weights(ours, str(step_dir))
    theirs = AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager")
    ids = torch.randint(0, ours.cfg.vocab_size, (2, 16))
    with torch.no_grad():
        assert torch.allclose(ours.eval()(ids), theirs.eval()(ids).logits, atol=1e-4)
