"""containers/trainer/entrypoint, run for real under /bin/sh with a stand-in `python` on PATH.

The stand-in records its argv and pid and exits with a chosen code, which shows the script
`exec`s (same pid: the Python entrypoint becomes PID 1 in a container, so signals reach it
directly), passes arguments through unchanged, drops SageMaker's `train` argument, and that the
exit code is the Python entrypoint's. What `agent.entrypoint` itself does with signals and the
failure file is tested with the agent.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "containers" / "trainer" / "entrypoint"

FAKE_PYTHON = """#!/bin/sh
printf '{"pid": %s, "argv": "%s"}' "$$" "$*" > "$RECORD"
exit "${FAKE_EXIT:-0}"
"""


@pytest.fixture
def fake_path(tmp_path):
    python = tmp_path / "bin" / "python"
    python.parent.mkdir()
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    return tmp_path


def run_entrypoint(fake_path: Path, *args: str, exit_code: int = 0) -> tuple[subprocess.CompletedProcess, dict, int]:
    record = fake_path / "record.json"
    env = dict(os.environ, PATH=f"{fake_path / 'bin'}:/usr/bin:/bin", RECORD=str(record), FAKE_EXIT=str(exit_code))
    proc = subprocess.Popen([str(SCRIPT), *args], env=env)
    proc.wait(timeout=30)
    result = subprocess.CompletedProcess(proc.args, proc.returncode)
    return result, json.loads(record.read_text()), proc.pid


def test_script_is_executable_posix_sh():
    assert os.access(SCRIPT, os.X_OK)
    assert SCRIPT.read_text().startswith("#!/bin/sh\n")
    subprocess.run(["sh", "-n", str(SCRIPT)], check=True)


def test_execs_the_python_entrypoint_with_arguments(fake_path):
    result, record, pid = run_entrypoint(fake_path, "--flag", "value")
    assert result.returncode == 0
    assert record["argv"] == "-m agent.entrypoint --flag value"
    assert record["pid"] == pid, "the script must exec, not fork, so the entrypoint keeps its pid"


def test_drops_sagemakers_train_argument(fake_path):
    _, record, _ = run_entrypoint(fake_path, "train")
    assert record["argv"] == "-m agent.entrypoint"
    _, record, _ = run_entrypoint(fake_path, "train", "--x")
    assert record["argv"] == "-m agent.entrypoint --x"


@pytest.mark.parametrize("code", [1, 3, 137])
def test_exit_code_is_the_entrypoints(fake_path, code):
    result, _, _ = run_entrypoint(fake_path, exit_code=code)
    assert result.returncode == code


# --- containers/controlplane/entrypoint -------------------------------------------------------------

CONTROLPLANE_SCRIPT = SCRIPT.parents[1] / "controlplane" / "entrypoint"

FAKE_AERIE = """#!/bin/sh
printf '{"pid": %s, "argv": "%s", "token_env": "%s"}' "$$" "$*" "${AERIE_ADMIN_TOKEN:-}" > "$RECORD"
exit 0
"""


def test_controlplane_entrypoint_installs_the_admin_token_and_execs_aerie(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "aerie").write_text(FAKE_AERIE)
    (bin_dir / "aerie").chmod(0o755)
    home = tmp_path / "home" / ".aerie"
    record = tmp_path / "record.json"
    env = dict(
        os.environ,
        PATH=f"{bin_dir}:/usr/bin:/bin",
        RECORD=str(record),
        AERIE_HOME=str(home),
        AERIE_ADMIN_TOKEN="tok-from-secrets-manager",
    )
    subprocess.run(["sh", "-n", str(CONTROLPLANE_SCRIPT)], check=True)
    proc = subprocess.Popen([str(CONTROLPLANE_SCRIPT), "up", "--host", "0.0.0.0"], env=env)
    assert proc.wait(timeout=30) == 0
    seen = json.loads(record.read_text())
    assert seen == {"pid": proc.pid, "argv": "up --host 0.0.0.0", "token_env": ""}
    token_file = home / "admin.token"
    assert token_file.read_text() == "tok-from-secrets-manager\n"
    assert token_file.stat().st_mode & 0o777 == 0o600


def test_controlplane_entrypoint_without_a_token_leaves_the_home_alone(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "aerie").write_text(FAKE_AERIE)
    (bin_dir / "aerie").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "AERIE_ADMIN_TOKEN"}
    env.update(PATH=f"{bin_dir}:/usr/bin:/bin", RECORD=str(tmp_path / "r.json"), AERIE_HOME=str(tmp_path / "h"))
    assert subprocess.run([str(CONTROLPLANE_SCRIPT), "up"], env=env).returncode == 0
    assert not (tmp_path / "h").exists()
