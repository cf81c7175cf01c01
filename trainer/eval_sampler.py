"""Answers of one checkpoint to the eval prompts: the torch half of the human eval loop.

`lambdas.eval_dispatch` is torch-free (it runs as an AWS Lambda), so it runs this as a short
process: `python -m trainer.eval_sampler < request.json > answers.json`. The request names the
checkpoint, the job's spec (from which the training config is rebuilt exactly as the trainer
built it: `--config`, `--set` args and the hyperparameters, relative paths against the job's
workdir), the prompts and the sampling settings. Only the model's weights are read from the DCP
checkpoint (a partial load: optimizer and RNG state stay in storage).

Request:  {"checkpoint": URI, "spec": {...}, "prompts": [...], "sampling": {max_new_tokens, temperature, top_k, seed}}
Answer:   {"answers": [...], "model": preset, "tokenizer": path}
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import torch

from aerie_contracts import env


def train_config_of(spec: dict[str, Any]):
    """The TrainConfig the job trained with (its `--config`/`--set` args and hyperparameters)."""
    from trainer import config as tc

    args = list(spec.get("args") or [])
    path, sets = None, []
    for i, arg in enumerate(args):
        if arg == "--config" and i + 1 < len(args):
            path = args[i + 1]
        elif arg.startswith("--config="):
            path = arg.split("=", 1)[1]
        elif arg == "--set" and i + 1 < len(args):
            sets.append(args[i + 1])
    workdir = (spec.get("backend_options") or {}).get("workdir")
    if workdir:
        os.environ[env.WORKDIR] = str(workdir)
    os.environ["SM_HPS"] = json.dumps(spec.get("hyperparameters") or {})
    os.environ.pop(env.ML_ROOT, None)
    return tc.load_config(path, sets)


def tokenizer_path(cfg) -> Path:
    """The training run's tokenizer: `data.tokenizer`, or the one the stdlib corpus build made
    (same directory naming as `trainer.data.build.prepare_stdlib_corpus`)."""
    from trainer.config import resolve_path
    from trainer.data.build import data_cache_dir

    if cfg.data.tokenizer:
        return resolve_path(cfg.data.tokenizer)
    d = cfg.data
    out = data_cache_dir(cfg) / f"stdlib-py{sys.version_info[0]}{sys.version_info[1]}-v{d.vocab_size}-b{d.max_bytes}"
    return out / "tokenizer.json"


def load_weights(model: torch.nn.Module, uri: str) -> None:
    """Only the `model` entries of a trainer checkpoint (file path, file:// or s3://)."""
    import torch.distributed.checkpoint as dcp

    from trainer.checkpoint.dcp import MODEL, _reader

    state = {MODEL: model.state_dict()}
    dcp.load(state, storage_reader=_reader(uri), no_dist=True)
    model.load_state_dict(state[MODEL])


def sample(request: dict[str, Any]) -> dict[str, Any]:
    from trainer.data import load_tokenizer
    from trainer.generate import generate
    from trainer.models import build_model, get_preset

    torch.set_num_threads(int(os.environ.get(env.EVAL_THREADS, "1")))
    cfg = train_config_of(request["spec"])
    model = build_model(get_preset(cfg.model.preset, **cfg.model.overrides))
    load_weights(model, request["checkpoint"])
    tok_path = tokenizer_path(cfg)
    tokenizer = load_tokenizer(tok_path)
    s = request.get("sampling") or {}
    answers = generate(
        model,
        tokenizer,
        request["prompts"],
        max_new_tokens=int(s.get("max_new_tokens", 64)),
        temperature=float(s.get("temperature", 0.8)),
        top_k=s.get("top_k", 50),
        seed=int(s.get("seed", 0)),
    )
    return {"answers": answers, "model": cfg.model.preset, "tokenizer": str(tok_path)}


def main() -> int:
    request = json.load(sys.stdin)
    json.dump(sample(request), sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
