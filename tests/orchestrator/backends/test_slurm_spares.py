"""The slurm backend's hot spares (issue #23) and memory tier (issue #22) without a cluster: the
allocation asks for spares, the nodes split the job's hosts alike, the handle learns them once the
job runs, an in-place attempt gives a blamed node's slot to a spare without replenishing, and every
node derives the same replication ring. The whole job on the real
one-host cluster: tests/integration/test_slurm_spares.py."""

from __future__ import annotations

from pathlib import Path

from aerie_contracts import env as aerie_env
from aerie_contracts.env import SLURM_PORT_BASE, SLURM_PORT_SPAN
from aerie_contracts.restarts import memory_tier_off
from agent.contract import write_json
from agent.slurm import memory_env as node_memory_env
from agent.slurm import memory_port, split_hosts
from orchestrator.backends import slurm as slurm_backend
from orchestrator.backends.base import LaunchRequest
from orchestrator.backends.nodeenv import memory_attempt_env as memory_env
from orchestrator.backends.slurm import (
    SlurmBackend,
    SlurmOptions,
    _learned,
    launch_document,
    render_script,
)
from orchestrator.spec import JobSpec
from tests.helpers.launch_requests import launch_request


def _request(number: int = 1, retry: dict | None = None, **more) -> LaunchRequest:
    spec = {"name": "spare", "resources": {"instance_count": 2, "spare_nodes": 1}, "backend": "slurm"}
    return launch_request(number, spec, retry, **more)


def test_the_allocation_holds_the_spares_and_a_spare_s_exit_ends_no_one():
    request = _request()
    script = render_script(request, SlurmOptions.resolve(request.spec, SlurmOptions()))
    assert "#SBATCH --nodes=3\n" in script and "--kill-on-bad-exit=0" in script
    assert launch_document(request, Path("/r"), Path("/w"), SlurmOptions())["nodes"] == 2
    # Without in-place restarts no spare could ever take a slot: none is asked for.
    plain = _request(retry={"max_restarts": 0})
    script = render_script(plain, SlurmOptions.resolve(plain.spec, SlurmOptions()))
    assert "#SBATCH --nodes=2\n" in script and "--kill-on-bad-exit=1" in script


def test_every_node_splits_the_sorted_hosts_alike():
    assert split_hosts(("node1", "node2", "node3"), 2) == (["node1", "node2"], ["node3"])
    assert split_hosts(("node1", "node2"), None) == (["node1", "node2"], [])


def test_the_handle_learns_hosts_and_spares_then_a_spare_takes_a_blamed_slot(tmp_path, monkeypatch):
    def scontrol(argv, **_):  # what `scontrol show node -o node3` says of the spare
        assert argv[:4] == ["scontrol", "show", "node", "-o"], argv
        return f"NodeName={argv[4]} Arch=x86_64 NodeAddr=10.1.0.3 NodeHostName={argv[4]} State=ALLOCATED\n"

    monkeypatch.setattr(slurm_backend, "_run", scontrol)
    root = tmp_path / "jobs" / "spare-abc" / "attempt-1"
    root.mkdir(parents=True)
    write_json(root / "launch.json", {"root": str(root), "master_port": None, "nodes": 2})
    launched = {"root": str(root), "hosts": [], "slurm_job_id": 77, "job_name": "spare-abc-a1", "spare_nodes": 1}
    assert _learned(launched, root) is None  # no node has started yet
    write_json(root / "hosts.json", {"hosts": ["node1", "node2"], "spares": ["node3"], "slurm_job_id": 77})
    first = _learned(launched, root)
    assert first is not None and first["hosts"] == ["node1", "node2"] and first["spares"] == ["node3"]
    assert _learned(first, root) is None  # learned once

    second = SlurmBackend(tmp_path / "jobs").launch(_request(2, in_place_of=first, replace_nodes={"node1": "node3"}))
    assert second["slurm_job_id"] == 77 and second["hosts"] == ["node3", "node2"]  # node1's rank slot
    assert second["spares"] == [] and second["replaced_nodes"] == {"node1": "node3"}  # not replenished
    assert second["master_addr"] == "10.1.0.3"  # node3 holds node rank 0 now: the rendezvous moves to it
    assert not (tmp_path / "jobs" / "spare-abc" / "attempt-2").exists()


def test_every_node_derives_the_same_memory_ring_from_the_job_id(monkeypatch, tmp_path):
    """Issue #22 on Slurm: the key in launch.json's attempt layer, each node's area under the
    control plane's root, and one replication port per node of the allocation (spares too)."""
    monkeypatch.setenv(aerie_env.MEMORY_CHECKPOINT_DIR, str(tmp_path / "shm"))
    spec = JobSpec.model_validate(
        {"name": "m", "entrypoint": ["python", "t.py"], "resources": {"instance_count": 2}, "backend": "slurm"}
    )
    spec = spec.model_copy(update={"retry": spec.retry.model_copy(update={"max_restarts": 2})})
    assert memory_tier_off(spec.model_dump(), "slurm") is None
    layer = memory_env(spec, "k" * 64)
    assert layer == {aerie_env.MEMORY_CHECKPOINT_EVERY: "auto", aerie_env.MEMORY_CHECKPOINT_KEY: "k" * 64}

    launch = {"memory_root": str(tmp_path / "shm")}
    everyone = ["node1", "node2", "node3"]
    mine = node_memory_env(launch, "node2", 4242, everyone)
    assert mine[aerie_env.MEMORY_CHECKPOINT_DIR] == str(tmp_path / "shm" / "node2")
    ports = [memory_port(4242, i) for i in range(3)]
    assert len(set(ports)) == 3 and all(SLURM_PORT_BASE <= p < SLURM_PORT_BASE + SLURM_PORT_SPAN for p in ports)
    assert memory_port(4242, 0) != SLURM_PORT_BASE + 4242 % SLURM_PORT_SPAN  # not the rendezvous port
    peers = mine[aerie_env.MEMORY_CHECKPOINT_PEERS].split(",")
    assert [p.split("=")[0] for p in peers] == everyone and [int(p.rsplit(":")[1]) for p in peers] == ports
    assert node_memory_env({}, "node2", 4242, everyone) == {}  # the tier is off
