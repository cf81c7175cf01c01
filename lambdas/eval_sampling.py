"""The eval's answers: the prompts a job's `eval` section names, and `python -m trainer.eval_sampler`
run as a short process beside the handler (torch lives there, not in a Lambda) — fine for the small
models an eval loop watches while they train; a big model would need a short job on its backend."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from aerie_contracts import env as aerie_env

log = logging.getLogger("aerie.lambdas.eval_dispatch")

MAX_PROMPTS = 50
SAMPLER_TIMEOUT_S = float(os.environ.get(aerie_env.EVAL_SAMPLER_TIMEOUT_S, "900"))
# The sampler's argv (JSON list), e.g. to run it under another interpreter or a scheduler; it
# reads the request as JSON on stdin and prints {"answers": [...]} as its last line.
SAMPLER_COMMAND = aerie_env.EVAL_SAMPLER_COMMAND


class SamplerFailed(RuntimeError):
    pass


def load_prompts(ev: dict[str, Any], spec: dict[str, Any]) -> list[str]:
    """Inline prompts, then the prompts file's (a JSON list, or one prompt per line)."""
    prompts = list(ev.get("prompts") or [])
    if ev.get("prompts_file"):
        path = Path(ev["prompts_file"]).expanduser()
        if not path.is_absolute():
            path = Path((spec.get("backend_options") or {}).get("workdir") or os.getcwd()) / path
        text = path.read_text()
        if path.suffix == ".json":
            prompts += [str(p) for p in json.loads(text)]
        else:
            prompts += [line for line in text.splitlines() if line.strip()]
    return prompts[:MAX_PROMPTS]


def checkpoint_meta(uri: str, step: int) -> dict[str, Any]:
    """Tokens seen and loss from the checkpoint's manifest (torch-free)."""
    from aerie_checkpoint.manifest import read_manifest

    try:
        manifest = read_manifest(uri) or {}
    except Exception as exc:  # the message shows "-" instead; sampling reads the checkpoint anyway
        log.warning("cannot read the manifest of %s: %s", uri, exc)
        manifest = {}
    return {
        "step": step,
        "tokens": manifest.get("tokens"),
        "loss": (manifest.get("metrics") or {}).get("loss"),
        "committed_at": manifest.get("committed_at"),
    }


def run_sampler(spec: dict[str, Any], uri: str, prompts: list[str], sampling: dict[str, Any]) -> list[str]:
    request = {"checkpoint": uri, "spec": spec, "prompts": prompts, "sampling": sampling}
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "PYTHONWARNINGS": "ignore"}
    repo_root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (repo_root, env.get("PYTHONPATH", "")) if p)
    try:
        proc = subprocess.run(
            sampler_command(),
            input=json.dumps(request),
            capture_output=True,
            text=True,
            timeout=SAMPLER_TIMEOUT_S,
            env=env,
        )
    except subprocess.TimeoutExpired:
        raise SamplerFailed(f"sampling {uri} took over {SAMPLER_TIMEOUT_S:.0f} s") from None
    if proc.returncode != 0:
        raise SamplerFailed(f"sampling {uri} failed ({proc.returncode}): {proc.stderr.strip()[-1500:]}")
    answers: list[str] = json.loads(proc.stdout.strip().splitlines()[-1])["answers"]
    if len(answers) != len(prompts):
        raise SamplerFailed(f"{len(answers)} answers for {len(prompts)} prompts")
    return answers


def sampler_command() -> list[str]:
    raw = os.environ.get(SAMPLER_COMMAND)
    if not raw:
        return [sys.executable, "-m", "trainer.eval_sampler"]
    try:
        argv = json.loads(raw)
    except ValueError:
        argv = None
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        raise SamplerFailed(f"{SAMPLER_COMMAND} must be a JSON list of strings (an argv), got {raw[:200]!r}")
    return argv
