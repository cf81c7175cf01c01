"""The slurm backend's hot spares (issue #23) and memory tier (issue #22) without a cluster: the
allocation asks for spares, the nodes split the job's hosts alike, the handle learns them once the
job runs, an in-place attempt gives a blamed node's slot to a spare and replenishes the pool with a
spare allocation of its own (submitted once, learned by poll, cancelled with the attempt), and every
node derives the same replication ring. The whole job on the real
one-host cluster: tests/integration/test_slurm_spares.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from aerie_contracts import env as aerie_env
from aerie_contracts.container import read_json, write_json
from aerie_contracts.env import SLURM_PORT_BASE, SLURM_PORT_SPAN
from agent.slurm import memory_env as node_memory_env
from agent.slurm import memory_port, split_hosts
from orchestrator.backends import slurm_cli, slurm_nodes
from orchestrator.backends.base import LaunchRequest
from orchestrator.backends.nodeenv import memory_attempt_env as memory_env
from orchestrator.backends.slurm import SlurmBackend
from orchestrator.backends.slurm_script import SlurmOptions, launch_document, render_script
from orchestrator.spec import JobSpec
from recovery.modes import memory_tier_off
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
    assert split_hosts(("node4", "node5"), 0) == ([], ["node4", "node5"])  # a spare allocation


def test_the_handle_learns_hosts_and_spares_then_a_spare_takes_a_blamed_slot(tmp_path, monkeypatch):
    def scontrol(argv, **_):  # what `scontrol show node -o node3` says of the spare
        assert argv[:4] == ["scontrol", "show", "node", "-o"], argv
        return f"NodeName={argv[4]} Arch=x86_64 NodeAddr=10.1.0.3 NodeHostName={argv[4]} State=ALLOCATED\n"

    monkeypatch.setattr(slurm_cli, "run", scontrol)
    root = tmp_path / "jobs" / "spare-abc" / "attempt-1"
    root.mkdir(parents=True)
    write_json(root / "launch.json", {"root": str(root), "master_port": None, "nodes": 2})
    launched = {"root": str(root), "hosts": [], "slurm_job_id": 77, "job_name": "spare-abc-a1", "spare_nodes": 1}
    assert slurm_nodes.learned(launched, root) is None  # no node has started yet
    write_json(root / "hosts.json", {"hosts": ["node1", "node2"], "spares": ["node3"], "slurm_job_id": 77})
    first = slurm_nodes.learned(launched, root)
    assert first is not None and first["hosts"] == ["node1", "node2"] and first["spares"] == ["node3"]
    assert slurm_nodes.learned(first, root) is None  # learned once

    monkeypatch.setattr(slurm_cli, "run", FakeSlurm(scontrol=scontrol))
    second = SlurmBackend(tmp_path / "jobs").start(_request(2, in_place_of=first, replace_nodes={"node1": "node3"}))
    assert second["slurm_job_id"] == 77 and second["hosts"] == ["node3", "node2"]  # node1's rank slot
    assert second["spares"] == [] and second["replaced_nodes"] == {"node1": "node3"}  # replenished later
    assert second["master_addr"] == "10.1.0.3"  # node3 holds node rank 0 now: the rendezvous moves to it
    assert [a["slurm_job_id"] for a in second["spare_allocations"]] == [78]  # the pool's refill
    assert not (tmp_path / "jobs" / "spare-abc" / "attempt-2").exists()


class FakeSlurm:
    """A recording stand-in for the Slurm CLI: sbatch hands out ids from 78 and remembers each
    job's name (squeue --name finds it), scancel and the rest are recorded."""

    def __init__(self, scontrol=None):
        self.calls: list[list[str]] = []
        self.jobs: dict[str, int] = {}
        self.scripts: dict[int, str] = {}
        self.scontrol = scontrol

    def __call__(self, argv, cwd=None, env=None):
        self.calls.append(list(argv))
        if argv[0] == "sbatch":
            job_id = 78 + len(self.jobs)
            text = Path(argv[-1]).read_text()
            name = next(line.split("=", 1)[1] for line in text.splitlines() if line.startswith("#SBATCH --job-name="))
            self.jobs[name], self.scripts[job_id] = job_id, text
            assert env is not None and Path(env[aerie_env.SLURM_LAUNCH]).parent == Path(argv[-1]).parent
            return f"{job_id}\n"
        if argv[0] == "squeue" and any(a.startswith("--name=") for a in argv):
            name = next(a.split("=", 1)[1] for a in argv if a.startswith("--name="))
            return f"{self.jobs[name]}\n" if name in self.jobs else ""
        if argv[0] == "scontrol" and self.scontrol is not None:
            return self.scontrol(argv)
        return ""

    def of(self, command: str) -> list[list[str]]:
        return [c for c in self.calls if c[0] == command]


def _in_place_from(tmp_path, *, memory: bool = False) -> tuple[dict, Path]:
    """Attempt 1's learned handle: node1 and node2 ran it, node3 waited as its spare."""
    root = tmp_path / "jobs" / "spare-abc" / "attempt-1"
    for host in ("node1", "node2", "node3"):
        (root / host / "agent").mkdir(parents=True)
    write_json(root / "launch.json", {"root": str(root), "master_port": None, "nodes": 2})
    handle = {
        "root": str(root),
        "hosts": ["node1", "node2"],
        "spares": ["node3"],
        "slurm_job_id": 77,
        "job_name": "spare-abc-a1",
        "nodes": 2,
        "spare_nodes": 1,
    }
    if memory:
        handle["memckpt_key"] = "k" * 64
        handle["memory_peers"] = {f"node{i}": f"127.0.0.1:{40000 + i}" for i in (1, 2, 3)}
    return handle, root


def test_a_spare_taking_a_slot_submits_a_spare_allocation_of_as_many_nodes(tmp_path, monkeypatch):
    slurm = FakeSlurm()
    monkeypatch.setattr(slurm_cli, "run", slurm)
    first, root = _in_place_from(tmp_path)
    (root / "node7" / "agent").mkdir(parents=True)  # a node that ran under this allocation before
    request = _request(2, in_place_of=first, replace_nodes={"node1": "node3"}, exclude_nodes=("node9",))
    second = SlurmBackend(tmp_path / "jobs").start(request)

    assert [c[0] for c in slurm.of("sbatch")] == ["sbatch"]  # the spare allocation alone
    script = slurm.scripts[78]
    assert "#SBATCH --job-name=spare-abc-a2-spares\n" in script and "#SBATCH --nodes=1\n" in script
    # Every node the job has used (the attempt's, the blamed, any that ran here) and the excluded.
    assert "#SBATCH --exclude=node1,node2,node3,node7,node9\n" in script
    assert "--kill-on-bad-exit=0" in script  # one spare's end ends no other
    folder = root / "spares-2"
    assert (folder / "job.sbatch").read_text() == script
    launch = read_json(folder / "launch.json")
    # All spares, in node directories beside the main allocation's, recording themselves apart.
    assert launch["nodes"] == 0 and launch["root"] == str(root)
    assert launch["hosts_file"] == str(folder / "hosts.json")
    assert launch["env"]["attempt"][aerie_env.ATTEMPT] == "spare-abc-a2"  # spares of this attempt
    assert (folder / "launch.json").stat().st_mode & 0o777 == 0o600
    assert second["spare_allocations"] == [
        {
            "job_name": "spare-abc-a2-spares",
            "attempt_id": "spare-abc-a2",
            "nodes": 1,
            "root": str(folder),
            "exclude": ["node1", "node2", "node3", "node7", "node9"],
            "slurm_job_id": 78,
        }
    ]
    assert second["spares"] == [] and read_json(root / "handle-2.json") == second


def test_a_blamed_node_replaced_by_no_spare_submits_nothing(tmp_path, monkeypatch):
    slurm = FakeSlurm()
    monkeypatch.setattr(slurm_cli, "run", slurm)
    first, _ = _in_place_from(tmp_path)
    second = SlurmBackend(tmp_path / "jobs").start(_request(2, in_place_of=first))
    assert slurm.of("sbatch") == [] and "spare_allocations" not in second


def test_the_spare_allocation_is_submitted_once_per_attempt(tmp_path, monkeypatch):
    slurm = FakeSlurm()
    monkeypatch.setattr(slurm_cli, "run", slurm)
    first, root = _in_place_from(tmp_path)
    backend = SlurmBackend(tmp_path / "jobs")
    request = _request(2, in_place_of=first, replace_nodes={"node1": "node3"})
    second = backend.start(request)
    assert backend.start(request) == second  # re-adopted: the recorded handle
    # A controller that died between sbatch and recording the handle finds the job by its name.
    (root / "handle-2.json").unlink()
    again = backend.start(request)
    assert len(slurm.of("sbatch")) == 1 and again["spare_allocations"][0]["slurm_job_id"] == 78


def test_unplaceable_spares_do_not_fail_the_attempt(tmp_path, monkeypatch):
    def refuse(argv, **_):
        if argv[0] == "sbatch":
            raise slurm_cli.SlurmError("sbatch: error: Requested node configuration is not available")
        return ""

    monkeypatch.setattr(slurm_cli, "run", refuse)
    first, _ = _in_place_from(tmp_path)
    second = SlurmBackend(tmp_path / "jobs").start(_request(2, in_place_of=first, replace_nodes={"node1": "node3"}))
    assert second["hosts"] == ["node3", "node2"] and "spare_allocations" not in second


def test_poll_learns_the_spare_allocation_s_nodes_as_spares_and_memory_peers(tmp_path, monkeypatch):
    slurm = FakeSlurm()
    monkeypatch.setattr(slurm_cli, "run", slurm)
    first, root = _in_place_from(tmp_path, memory=True)
    second = SlurmBackend(tmp_path / "jobs").start(_request(2, in_place_of=first, replace_nodes={"node1": "node3"}))
    allocation = second["spare_allocations"][0]
    assert allocation["memory_index"] == 3  # its ring ports follow the main allocation's 2 + 1 nodes
    launch = read_json(root / "spares-2" / "launch.json")
    assert launch["memory_job_id"] == 77 and launch["memory_index"] == 3 and launch["memory_root"]
    assert slurm_nodes.learned_spares(second) is None  # its nodes have not started yet

    write_json(
        root / "spares-2" / "hosts.json",
        {"hosts": [], "spares": ["node4"], "slurm_job_id": 78, "memory_peers": {"node4": "127.0.0.1:40004"}},
    )
    learned = slurm_nodes.learned_spares(second)
    assert learned is not None and learned["spares"] == ["node4"]
    assert learned["spare_allocations"][0]["hosts"] == ["node4"]
    assert learned["memory_peers"]["node4"] == "127.0.0.1:40004" and learned["memory_peers"]["node3"]
    assert slurm_nodes.learned_spares(learned) is None  # learned once

    # The next in-place attempt hands node4 a slot as it would a main-allocation spare, and refills.
    third = SlurmBackend(tmp_path / "jobs").start(_request(3, in_place_of=learned, replace_nodes={"node2": "node4"}))
    assert third["hosts"] == ["node3", "node4"] and third["spares"] == []
    assert [a["slurm_job_id"] for a in third["spare_allocations"]] == [78, 79]
    assert third["spare_allocations"][1]["memory_index"] == 4
    assert "#SBATCH --exclude=node1,node2,node3,node4\n" in slurm.scripts[79]


@pytest.mark.parametrize("how", ["stop", "fence"])
def test_stop_and_fence_cancel_the_spare_allocations(tmp_path, monkeypatch, how):
    slurm = FakeSlurm()
    monkeypatch.setattr(slurm_cli, "run", slurm)
    first, _ = _in_place_from(tmp_path)
    backend = SlurmBackend(tmp_path / "jobs")
    second = backend.start(_request(2, in_place_of=first, replace_nodes={"node1": "node3"}))
    if how == "stop":
        backend.stop(second)
        assert slurm.of("scancel") == [["scancel", "77"], ["scancel", "78"]]
    else:
        backend.fence(second, ["node2"])
        assert ["scancel", "78"] in slurm.of("scancel")  # the spares: a plain cancel
        assert ["scancel", "--signal=KILL", "77.0"] in slurm.of("scancel")  # the attempt's step


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


def test_a_spare_allocation_s_ring_ports_follow_the_main_allocation_s():
    """Derived from the main allocation's job id, after its nodes: never one of theirs."""
    launch = {"memory_root": "/shm", "memory_job_id": 4242, "memory_index": 3}
    mine = node_memory_env(launch, "node4", 4243, ["node4"])
    assert mine[aerie_env.MEMORY_CHECKPOINT_PEERS].endswith(f":{memory_port(4242, 3)}")


def test_a_long_exclude_list_is_compressed_or_costs_the_spare_not_the_attempt(tmp_path, monkeypatch):
    slurm = FakeSlurm(scontrol=lambda argv: "node[1-99]\n" if argv[:3] == ["scontrol", "show", "hostlist"] else "")
    monkeypatch.setattr(slurm_cli, "run", slurm)
    first, _ = _in_place_from(tmp_path)
    many = tuple(f"node{i}" for i in range(4, 100))  # 96 blamed nodes: over an #SBATCH value's 256
    request = _request(2, in_place_of=first, replace_nodes={"node1": "node3"}, exclude_nodes=many)
    second = SlurmBackend(tmp_path / "jobs").start(request)
    assert "#SBATCH --exclude=node[1-99]\n" in slurm.scripts[78]  # Slurm's own compressed form
    assert len(second["spare_allocations"][0]["exclude"]) == 99  # the handle keeps every name

    # Where scontrol does not compress them, the in-place attempt goes on without the spare.
    slurm = FakeSlurm()
    monkeypatch.setattr(slurm_cli, "run", slurm)
    first, _ = _in_place_from(tmp_path / "again")
    request = _request(2, in_place_of=first, replace_nodes={"node1": "node3"}, exclude_nodes=many)
    second = SlurmBackend(tmp_path / "again" / "jobs").start(request)
    assert slurm.of("sbatch") == [] and "spare_allocations" not in second and second["hosts"] == ["node3", "node2"]
