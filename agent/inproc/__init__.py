"""The in-process probe (issue #33): steps, loss, collectives and sections from inside every rank.

Aerie starts every rank itself (`agent.rank`), so it can see a foreign trainer's progress with no
change to the user's command or code: `child_env` puts `site/` first on the rank's `PYTHONPATH`,
and Python imports `site/sitecustomize.py` at start-up. That file chains to any `sitecustomize`
that was next on the path, then only waits (an import hook, no torch import of its own) until the
script imports torch; then `hooks.install` registers torch's global hooks and `sink` reports what
they see through the metrics stream the agent already reads (aerie_contracts.probe says what).

What it never does: raise into the trainer (every hook body is guarded: the first error turns the
probe off and says so once on stderr), synchronise a device on the step path (a GPU loss is copied
non-blocking and read when its event has completed, a step later), or import torch itself.

This package's `__init__` is torch-free (the agent imports it); `hooks`, `runtime` and `sink` run
inside the rank only.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

from aerie_contracts import env
from aerie_contracts import probe as contract

SITE_DIR = Path(__file__).resolve().parent / "site"


def probe_mode(environ: Mapping[str, str]) -> str:
    """`on` or `off`: `AERIE_PROBE` where the agent set it, else the spec's `health.probe` from
    `AERIE_HEALTH` (a rank wrapper run by an older agent), else on (`health.probe`'s default)."""
    mode = (environ.get(env.PROBE) or "").strip().lower()
    if mode in contract.MODES:
        return mode
    try:
        health = json.loads(environ.get(env.HEALTH) or "{}")
        mode = str(health.get("probe") or contract.ON).lower() if isinstance(health, dict) else contract.ON
    except ValueError:
        mode = contract.ON
    return mode if mode in contract.MODES else contract.ON


def child_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment a rank starts with: `environ`, with the probe's site directory first on
    `PYTHONPATH` (once), unless the probe is off."""
    out = dict(environ)
    mode = probe_mode(environ)
    out[env.PROBE] = mode
    site = str(SITE_DIR)
    parts = [p for p in (out.get("PYTHONPATH") or "").split(os.pathsep) if p and p != site]
    if mode == contract.ON:
        parts.insert(0, site)
    if parts:
        out["PYTHONPATH"] = os.pathsep.join(parts)
    else:
        out.pop("PYTHONPATH", None)
    return out
