"""`aerie backends`: what this control plane's settings configure, and whether each answers."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from devtools.harness.control_plane import REPO

# Not timing-sensitive: `make test` runs it with the unit tests, on two workers (tests/conftest.py).
pytestmark = pytest.mark.side_by_side


def _backends(env: dict[str, str]) -> dict[str, str]:
    r = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "backends"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env={**env, "COLUMNS": "200"},
    )
    assert r.returncode == 0, r.stderr
    rows = {}
    for line in r.stdout.splitlines():
        cells = [c.strip() for c in line.strip("│┃ ").split("│")]
        if len(cells) == 3 and cells[0] in ("local", "slurm", "sagemaker"):
            rows[cells[0]] = cells[1]
    return rows


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "SLURM_")) and k != "AERIE_SAGEMAKER"}


def test_backends_lists_local_and_a_reachable_slurm(slurm_cluster):
    rows = _backends(
        {
            **_clean_env(),
            **slurm_cluster,
            "AWS_CONFIG_FILE": "/nonexistent",
            "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent",
        }
    )
    assert rows == {"local": "yes", "slurm": "yes"}


def test_slurm_without_a_controller_is_listed_unreachable(slurm_cluster, tmp_path):
    conf = tmp_path / "slurm.conf"
    real = open(slurm_cluster["SLURM_CONF"]).read()
    # Nothing listens on port 9; a short MessageTimeout makes Slurm's client give up in 1 s, not 9.
    conf.write_text(re.sub(r"(?m)^SlurmctldPort=\d+$", "SlurmctldPort=9", real) + "\nMessageTimeout=2\n")
    rows = _backends(
        {
            **_clean_env(),
            "SLURM_CONF": str(conf),
            "AWS_CONFIG_FILE": "/nonexistent",
            "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent",
        }
    )
    assert rows["slurm"] == "no"


def test_sagemaker_is_listed_when_credentials_and_region_are_configured(slurm_cluster):
    rows = _backends(
        {
            **_clean_env(),
            **slurm_cluster,
            "AWS_REGION": "us-east-1",
            "AWS_ACCESS_KEY_ID": "AKIAEXAMPLE",
            "AWS_SECRET_ACCESS_KEY": "secret",
        }
    )
    assert rows == {"local": "yes", "slurm": "yes", "sagemaker": "yes"}
