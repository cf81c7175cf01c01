"""Run a bench script as a user would, for the benches' smoke tests."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_bench(script: str, *args: str, timeout: float) -> list[str]:
    """`python bench/<script> ARGS` from the repository root (a failure raises); its stdout's lines
    (a bench prints its result as the last one, a JSON object)."""
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=True,
        cwd=ROOT,
    ).stdout
    return out.strip().splitlines()
