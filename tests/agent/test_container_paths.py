"""`/opt/ml` bound to a node's own directory in a mount namespace of its own (agent.container_paths),
as the local backend starts SageMaker-API nodes. Real `unshare` and mount(2): needs root (CI runs
as root) and fails, never skips, without it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.backends.local_spawn import check_container_paths, container_paths_argv


@pytest.fixture(autouse=True)
def _can_bind():
    try:
        check_container_paths()
    except RuntimeError as exc:
        pytest.fail(f"container paths are unavailable here: {exc}")


def test_two_nodes_each_see_their_own_directory_at_opt_ml(tmp_path):
    outs = []
    for host in ("algo-1", "algo-2"):
        root = tmp_path / host
        (root / "input" / "config").mkdir(parents=True)
        (root / "input" / "config" / "resourceconfig.json").write_text(json.dumps({"current_host": host}))
        argv = container_paths_argv(root, ["cat", "/opt/ml/input/config/resourceconfig.json"])
        outs.append(subprocess.run(argv, capture_output=True, text=True, timeout=60))
    assert [json.loads(o.stdout)["current_host"] for o in outs] == ["algo-1", "algo-2"], outs
    assert not Path("/opt/ml/input").exists()  # the host's /opt/ml is untouched


def test_a_failed_bind_is_the_nodes_launch_failure(tmp_path):
    root = tmp_path / "algo-1"
    r = subprocess.run(
        [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "--",
            sys.executable,
            "-m",
            "agent.container_paths",
            str(root / "missing"),
            "--",
            "true",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 1 and "container paths" in r.stderr
    outcome = json.loads((root / "missing" / "agent" / "exit.json").read_text())
    assert outcome["reason"]["kind"] == "launch.failed" and os.path.exists(root / "missing")
