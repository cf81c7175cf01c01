"""The slurm backend's batch script and launch file, without a cluster: what goes where, and safely."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from aerie_contracts.container import NodeContract
from agent.slurm import compose_env
from orchestrator.backends.base import LaunchRequest
from orchestrator.backends.nodeenv import node_env
from orchestrator.backends.slurm_cli import exit_code, state_word
from orchestrator.backends.slurm_script import SlurmOptions, launch_document, render_script
from orchestrator.spec import JobSpec
from tests.helpers.launch_requests import attempt_request


def _request(exclude: tuple[str, ...] = (), **spec_fields) -> LaunchRequest:
    spec = JobSpec.model_validate(
        {
            "name": "slurm-job",
            "entrypoint": ["python", "train.py"],
            "args": ["--note", "$(rm -rf /); `id`"],
            "hyperparameters": {"lr": "3e-4"},
            "env": {"USER_VAR": "a b'c\"d"},
            "resources": {"instance_count": 2, "procs_per_node": 2},
            "backend": "slurm",
            **spec_fields,
        }
    )
    resume_from = "s3://b/ck/slurm-job-abc123/step_00000100"
    return attempt_request(spec, 2, "slurm-job-abc123", resume_from=resume_from, exclude_nodes=exclude)


def _sbatch_lines(script: str) -> list[str]:
    return [line for line in script.splitlines() if line.startswith("#SBATCH")]


def test_script_asks_for_one_task_per_node_and_excludes_blamed_nodes():
    request = _request(exclude=("node2", "node7"))
    script = render_script(request, SlurmOptions.resolve(request.spec, SlurmOptions()))
    assert _sbatch_lines(script) == [
        "#SBATCH --job-name=slurm-job-abc123-a2",
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --output=slurm-%j.out",
        "#SBATCH --open-mode=append",
        "#SBATCH --exclude=node2,node7",
        "#SBATCH --time=1470",  # max_runtime_s (1 day) + the backstop: the control plane stops it first
    ]
    assert script.splitlines()[-1].startswith("exec srun --kill-on-bad-exit=1 --ntasks-per-node=1 ")


def test_backend_options_become_partition_account_time_and_gres():
    request = _request(
        backend_options={
            "slurm": {
                "partition": "gpu",
                "account": "llm-team",
                "time": "2-00:00:00",
                "gpus_per_node": 8,
                "cpus_per_task": 96,
            }
        }
    )
    options = SlurmOptions.resolve(request.spec, SlurmOptions(partition="default-part", account="default-acct"))
    lines = _sbatch_lines(render_script(request, options))
    for expected in (
        "#SBATCH --partition=gpu",
        "#SBATCH --account=llm-team",
        "#SBATCH --time=2-00:00:00",
        "#SBATCH --gres=gpu:8",
        "#SBATCH --cpus-per-task=96",
    ):
        assert expected in lines
    assert "--exclude" not in "\n".join(lines)
    # No GPU count travels: Slurm's --gres sets CUDA_VISIBLE_DEVICES, from which the agent counts SM_NUM_GPUS.
    assert "num_gpus" not in launch_document(request, Path("/r"), Path("/w"), options)


def test_control_plane_defaults_apply_when_the_spec_is_silent():
    request = _request()
    lines = _sbatch_lines(render_script(request, SlurmOptions.resolve(request.spec, SlurmOptions(partition="debug"))))
    assert "#SBATCH --partition=debug" in lines


def test_no_user_string_reaches_the_script():
    request = _request()
    script = render_script(request, SlurmOptions.resolve(request.spec, SlurmOptions()))
    for user_value in ("rm -rf", "`id`", "train.py", "USER_VAR", "3e-4", "tok"):
        assert user_value not in script
    document = launch_document(request, Path("/r"), Path("/w"), SlurmOptions())
    assert json.loads(document["env"]["attempt"]["AERIE_ENTRYPOINT"]) == [
        "python",
        "train.py",
        "--note",
        "$(rm -rf /); `id`",
    ]


@pytest.mark.parametrize(
    "field, value",
    [
        ("partition", "gpu\n#SBATCH --uid=0"),
        ("account", "a b"),
        ("time", "1;reboot"),
        ("partition", "$(id)"),
    ],
)
def test_unsafe_values_are_refused(field, value):
    request = _request(backend_options={"slurm": {field: value}})
    with pytest.raises(ValueError, match="#SBATCH"):
        render_script(request, SlurmOptions.resolve(request.spec, SlurmOptions()))


def test_unsafe_exclude_and_unknown_options_are_refused():
    request = _request(exclude=("node1 --uid=0",))
    with pytest.raises(ValueError, match="exclude_nodes"):
        render_script(request, SlurmOptions.resolve(request.spec, SlurmOptions()))
    with pytest.raises(ValueError, match=r"unknown backend_options\.slurm keys"):
        SlurmOptions.resolve(_request(backend_options={"slurm": {"partiton": "gpu"}}).spec, SlurmOptions())


def test_node_built_env_equals_the_local_backends(tmp_path, monkeypatch):
    """agent.slurm builds on the node exactly the environment nodeenv builds for a local node."""
    monkeypatch.setenv("AERIE_HOME", "/control/plane/only")
    monkeypatch.setenv("SOME_TOOL_VAR", "kept")
    request = _request()
    contract = NodeContract(
        ml_root=tmp_path / "node2", hosts=("node1", "node2"), current_host="node2", hyperparameters={"lr": "3e-4"}
    )
    document = launch_document(request, tmp_path, Path("/work"), SlurmOptions(), in_place_wait_s=120.0)
    on_node = compose_env(os.environ, document["env"], contract.env(), "127.0.0.1", 21234)
    # The local backend adds the in-place wait after node_env, as it does for every node.
    local = node_env(request, contract, "127.0.0.1", 21234, Path("/work"))
    assert on_node == {**local, "AERIE_IN_PLACE_WAIT_S": "120.0"}
    assert on_node["AERIE_RESUME_FROM"] == "s3://b/ck/slurm-job-abc123/step_00000100"
    assert on_node["SOME_TOOL_VAR"] == "kept" and "AERIE_HOME" not in on_node
    assert on_node["USER_VAR"] == "a b'c\"d"


@pytest.mark.parametrize(
    "raw, word",
    [("COMPLETED", "COMPLETED"), (["CANCELLED", "COMPLETING"], "CANCELLED"), ("CANCELLED by 0", "CANCELLED"), ("", "")],
)
def test_state_words_from_every_slurm_version(raw, word):
    assert state_word(raw) == word


@pytest.mark.parametrize(
    "raw, code", [(0, 0), ("2:0", 2), ("0:9", 0), (None, None), ({"status": "ERROR", "return_code": {"number": 3}}, 3)]
)
def test_exit_codes_from_every_slurm_version(raw, code):
    assert exit_code(raw) == code
