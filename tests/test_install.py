"""Issue #32 acceptance 4: the product installs without its scaffolding.

In a fresh virtual environment, `pip install .` (no extras) of a scratch copy of this tree imports
`orchestrator`, `agent` and `lambdas`, and brings neither moto nor a test tool; `aerie up` there,
with no S3 endpoint configured, exits naming what to install for the dev stack's loopback S3.

A real pip install of the core dependencies: about 2.5 minutes here with a cold pip cache (pip's
own cache, ~/.cache/pip, is reused by later runs), so `slow`; not timing-sensitive, so it runs
beside the unit tests (`side_by_side`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from aerie_contracts import env

REPO = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.slow, pytest.mark.side_by_side, pytest.mark.timeout(1500)]

# The distributions `pip install aerie` must not bring: the dev stack's server and the test tools.
NOT_INSTALLED = ("moto", "flask", "pytest", "pytest-xdist", "pytest-timeout", "ruff", "mypy", "torch")


def _scratch_copy(dest: Path) -> None:
    """The working tree as a clone would have it: tracked and untracked files git does not ignore."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for name in filter(None, (n.decode() for n in listed)):
        src = REPO / name
        if src.is_file():  # a tracked file deleted in the working tree is not copied
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)


def test_pip_install_without_extras_imports_the_product_and_brings_no_scaffolding(tmp_path):
    tree, venv, home = tmp_path / "aerie", tmp_path / "venv", tmp_path / "home"
    _scratch_copy(tree)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    py = venv / "bin" / "python"
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PIP_REQUIRE_VIRTUALENV")}
    pip = subprocess.run(
        [str(py), "-m", "pip", "install", "-q", str(tree)], env=clean, capture_output=True, text=True, timeout=1200
    )
    assert pip.returncode == 0, pip.stdout[-3000:] + pip.stderr[-3000:]

    # Imported from the fresh venv's site-packages (cwd outside the repository), not from the tree.
    code = "import orchestrator, agent, lambdas; print(orchestrator.__file__)"
    r = subprocess.run([str(py), "-c", code], cwd=tmp_path, env=clean, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().startswith(str(venv)), r.stdout

    # `pip show` finds none of them (it exits 1 when it finds nothing).
    for dist in NOT_INSTALLED:
        shown = subprocess.run([str(py), "-m", "pip", "show", dist], env=clean, capture_output=True, text=True)
        assert shown.returncode != 0, f"`pip install .` brought {dist}:\n{shown.stdout}"

    # Without moto, `aerie up` on the embedded defaults stops before serving and says what to install.
    up_env = {k: v for k, v in clean.items() if k not in (env.S3_ENDPOINT, "AWS_ENDPOINT_URL")}
    up_env |= {env.HOME: str(home), "COLUMNS": "300", "NO_COLOR": "1"}
    up = subprocess.run(
        [str(venv / "bin" / "aerie"), "up", "--port", "0"],
        cwd=tmp_path,
        env=up_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    said = " ".join((up.stdout + up.stderr).split())
    assert up.returncode == 1, said
    assert "pip install 'aerie[stack]'" in said and "moto" in said, said
