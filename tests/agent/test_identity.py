"""A node's identity from the platform's own contract: resourceconfig.json, then Slurm's or the
toolkit's variables, then defaults; the agent's directory derived from the ML root."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from aerie_contracts.container import DEFAULT_GROUP, NodeContract, resource_config
from agent.config import AgentConfig
from agent.identity import (
    DEFAULT_MASTER_PORT,
    IdentityError,
    expand_hostlist,
    from_slurm,
    node_dir,
    resolve_identity,
)
from agent.toolkit_env import trainer_env

REPO = Path(__file__).resolve().parents[2]

# SageMaker's resourceconfig.json of a heterogeneous job, as the platform writes it (group hosts
# unsorted, as in SageMaker's documentation).
HETERO = {
    "current_host": "algo-3",
    "current_instance_type": "ml.p4d.24xlarge",
    "current_group_name": "gpu",
    "hosts": ["algo-1", "algo-2", "algo-3"],
    "instance_groups": [
        {"instance_group_name": "data", "instance_type": "ml.c5.18xlarge", "hosts": ["algo-1"]},
        {"instance_group_name": "gpu", "instance_type": "ml.p4d.24xlarge", "hosts": ["algo-3", "algo-2"]},
    ],
    "network_interface_name": "eth0",
}


def _root(tmp_path: Path, rc: dict | str | None) -> Path:
    config = tmp_path / "ml" / "input" / "config"
    config.mkdir(parents=True)
    if rc is not None:
        (config / "resourceconfig.json").write_text(rc if isinstance(rc, str) else json.dumps(rc))
    return tmp_path / "ml"


def test_sagemaker_resourceconfig_is_read_first(tmp_path):
    root = _root(tmp_path, HETERO)
    # Stale or foreign variables lose against the platform's file.
    ident = resolve_identity(
        {"AERIE_ML_ROOT": str(root), "SM_HOSTS": '["x"]', "SM_CURRENT_HOST": "x", "SLURM_JOB_NODELIST": "n1"}
    )
    assert ident.source == "resourceconfig"
    assert ident.hosts == ("algo-1", "algo-2", "algo-3") and ident.current_host == "algo-3" and ident.node_rank == 2
    assert ident.master_addr == "algo-1" and ident.master_port == DEFAULT_MASTER_PORT  # by name, nothing passed
    assert ident.instance_type == "ml.p4d.24xlarge" and ident.group == "gpu" and ident.network_interface == "eth0"
    assert ident.group_hosts == ["algo-3", "algo-2"]
    assert ident.node_dir == root / "agent" and ident.metrics_dir == root / "output" / "metrics"
    env = trainer_env(ident, {"CUDA_VISIBLE_DEVICES": "0,1,2,3"})
    assert json.loads(env["SM_HOSTS"]) == ["algo-1", "algo-2", "algo-3"] and env["SM_CURRENT_HOST"] == "algo-3"
    assert env["SM_CURRENT_INSTANCE_GROUP"] == "gpu" and json.loads(env["SM_IS_HETERO"]) is True
    assert json.loads(env["SM_INSTANCE_GROUPS"]) == ["data", "gpu"] and env["SM_NUM_GPUS"] == "4"
    assert json.loads(env["SM_RESOURCE_CONFIG"]) == HETERO
    assert env["AERIE_NODE_DIR"] == str(root / "agent") and env["AERIE_ML_ROOT"] == str(root)


def test_unsorted_hosts_give_every_node_the_same_order_and_master(tmp_path):
    rc = {**HETERO, "hosts": ["algo-3", "algo-1", "algo-2"], "current_host": "algo-1"}
    ident = resolve_identity({"AERIE_ML_ROOT": str(_root(tmp_path, rc))})
    assert ident.hosts == ("algo-1", "algo-2", "algo-3") and ident.node_rank == 0 and ident.master_addr == "algo-1"


def test_a_backend_that_knows_the_address_and_port_overrides_the_name(tmp_path):
    root = _root(tmp_path, {**HETERO, "current_host": "algo-2"})
    ident = resolve_identity({"AERIE_ML_ROOT": str(root), "AERIE_MASTER_ADDR": "10.0.0.5", "AERIE_MASTER_PORT": "4242"})
    assert (ident.master_addr, ident.master_port) == ("10.0.0.5", 4242)


@pytest.mark.parametrize(
    "rc, message",
    [
        ("{not json", "is not JSON"),
        ("[]", "must hold a JSON object"),
        ({"current_host": "algo-9", "hosts": ["algo-1"]}, "not one of hosts"),
        ({"current_host": "algo-1", "hosts": []}, "non-empty list"),
        ({"current_host": "algo-1", "hosts": ["algo-1"], "instance_groups": "gpu"}, "instance_groups"),
    ],
)
def test_a_bad_resourceconfig_is_a_clear_error_not_a_guess(tmp_path, rc, message):
    root = _root(tmp_path, rc)
    with pytest.raises(IdentityError, match=message):
        resolve_identity({"AERIE_ML_ROOT": str(root)})
    env = {"AERIE_ML_ROOT": str(root), "AERIE_ENTRYPOINT": '["true"]'}
    with pytest.raises(SystemExit, match=r"resourceconfig\.json"):
        AgentConfig.from_env(env)
    assert (root / "output" / "failure").read_text().startswith(f"launch.failed: {root}/input/config/")


def test_slurm_variables_without_the_file(tmp_path):
    env = {
        "AERIE_ML_ROOT": str(_root(tmp_path, None)),
        "SLURM_JOB_NODELIST": "gpu[09-11],cpu1",
        "SLURMD_NODENAME": "gpu10",
        "SLURM_JOB_ID": "123",
    }
    ident = resolve_identity(env)
    assert ident.source == "slurm" and ident.hosts == ("cpu1", "gpu09", "gpu10", "gpu11")
    assert ident.node_rank == 2 and ident.master_addr == "cpu1" and ident.master_port == 20123
    assert from_slurm(env, expand=lambda _: ["gpu10", "a"], master_addr="127.0.0.1").master_addr == "127.0.0.1"
    assert expand_hostlist("rack[1-2]-n[1,3]") == ["rack1-n1", "rack1-n3", "rack2-n1", "rack2-n3"]
    with pytest.raises(IdentityError, match="not in SLURM_JOB_NODELIST"):
        resolve_identity({**env, "SLURMD_NODENAME": "elsewhere"})


def test_toolkit_variables_then_defaults(tmp_path):
    root = _root(tmp_path, None)
    ident = resolve_identity(
        {"AERIE_ML_ROOT": str(root), "SM_HOSTS": '["algo-2","algo-1"]', "SM_CURRENT_HOST": "algo-2"}
    )
    assert (ident.source, ident.hosts, ident.node_rank) == ("sm_env", ("algo-1", "algo-2"), 1)
    alone = resolve_identity({"AERIE_ML_ROOT": str(root)})
    assert (alone.source, alone.hosts, alone.master_addr) == ("default", ("algo-1",), "127.0.0.1")
    assert resolve_identity({}).ml_root == Path("/opt/ml")


def test_a_rank_without_aerie_node_dir_writes_where_the_agent_reads(tmp_path):
    """agent.rank derives the agent's directory from the ML root; it never falls back to the cwd."""
    root = tmp_path / "ml"
    NodeContract(root, ("algo-1",), "algo-1").write()
    env = {"PATH": "/usr/bin:/bin", "AERIE_ML_ROOT": str(root), "RANK": "3"}
    out = subprocess.run(
        [sys.executable, "-m", "agent.rank", "--", sys.executable, "-c", "print('hi'); raise SystemExit(4)"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 4 and "[algo-1 rank 3] hi" in out.stdout
    assert node_dir(env) == root / "agent"
    assert (root / "agent" / "ranks" / "rank-3.pid").exists()
    assert json.loads((root / "agent" / "ranks" / "rank-3.exit.json").read_text())["exit_code"] == 4
    assert not (tmp_path / "ranks").exists()


def test_a_sagemaker_jobs_hot_spares_are_set_apart_on_every_instance(tmp_path):
    """AERIE_SPARE_HOSTS (the sagemaker backend's `resources.spare_nodes`): the attempt's nodes
    leave the spares out; a spare is a node of no attempt yet, its own host alone."""
    # One homogeneous group, its hosts unsorted as in HETERO.
    m5 = "ml.m5.xlarge"
    group = {"instance_group_name": DEFAULT_GROUP, "instance_type": m5, "hosts": ["algo-3", "algo-2", "algo-1"]}
    plain = resource_config("algo-2", ["algo-1", "algo-2", "algo-3"], m5, "eth0", instance_groups=[group])
    root = _root(tmp_path, plain)
    env = {"AERIE_ML_ROOT": str(root), "AERIE_SPARE_HOSTS": "algo-3"}
    node = resolve_identity(env)
    assert node.hosts == ("algo-1", "algo-2") and node.node_rank == 1 and node.master_addr == "algo-1"
    assert node.group_hosts == ["algo-2", "algo-1"]
    (root / "input" / "config" / "resourceconfig.json").write_text(json.dumps({**plain, "current_host": "algo-3"}))
    spare = resolve_identity(env)
    assert spare.hosts == ("algo-3",) and spare.node_rank == 0
    assert spare.master_addr == "algo-1"  # the rendezvous host of all, until it is handed a slot
    assert resolve_identity({"AERIE_ML_ROOT": str(root)}).hosts == ("algo-1", "algo-2", "algo-3")
