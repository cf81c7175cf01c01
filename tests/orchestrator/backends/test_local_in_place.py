"""The local backend's in-place attempt: nothing spawned, the failed attempt's handle reused with
its own attempt id and rendezvous port, and only that attempt's outcomes read from the nodes'
`exit.json` (the agent, a real process here, serves both attempts)."""

from __future__ import annotations

import json
import subprocess
import sys

from orchestrator.backends.base import LaunchRequest
from orchestrator.backends.local import LocalBackend
from orchestrator.spec import JobSpec


def _request(previous: dict) -> LaunchRequest:
    spec = JobSpec.from_dict({"name": "warm", "entrypoint": ["python"], "resources": {"instance_count": 1}})
    return LaunchRequest("warm-1", "warm", "warm-1-a2", 2, spec, "http://127.0.0.1:9", "tok", in_place_of=previous)


def test_an_in_place_attempt_reuses_the_agents_and_reads_only_its_own_outcome(tmp_path):
    root = tmp_path / "jobs" / "warm-1" / "attempt-1"
    agent_dir = root / "algo-1" / "agent"
    agent_dir.mkdir(parents=True)
    # A process whose command line names the agent, standing for the agent kept up.
    agent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "agent"])
    try:
        (agent_dir / "agent.pid").write_text(str(agent.pid))
        (agent_dir / "exit.json").write_text(json.dumps({"exit_code": 1, "attempt": "warm-1-a1", "t": 1.0}))
        backend = LocalBackend(tmp_path / "jobs")
        previous = {"root": str(root), "hosts": ["algo-1"]}
        assert backend.poll(previous).state == "Failed"  # attempt 1, as before

        handle = backend.start(_request(previous))
        assert handle["root"] == str(root) and handle["attempt_id"] == "warm-1-a2" and handle["in_place"]
        assert backend.start(_request(previous)) == handle  # idempotent: the same port
        assert not (root.parent / "attempt-2").exists()  # nothing launched anew
        assert backend.poll(handle).state == "Running"  # attempt 1's outcome is not attempt 2's

        (agent_dir / "exit.json").write_text(json.dumps({"exit_code": 0, "attempt": "warm-1-a2", "t": 2.0}))
        assert backend.poll(handle).state == "Completed"
    finally:
        agent.kill()
        agent.wait()


def test_an_in_place_attempt_gets_a_replication_key_of_its_own(tmp_path):
    """The memory tier's replication key is the attempt's: an in-place successor's handle (which
    GET .../next hands to its agents) holds a new one; idempotent like the port."""
    from aerie_contracts import memckpt

    root = tmp_path / "jobs" / "warm-1" / "attempt-1"
    root.mkdir(parents=True)
    backend = LocalBackend(tmp_path / "jobs")
    previous = {"root": str(root), "hosts": ["algo-1"], memckpt.HANDLE_KEY: memckpt.new_key()}
    handle = backend.start(_request(previous))
    key = handle[memckpt.HANDLE_KEY]
    assert key != previous[memckpt.HANDLE_KEY] and len(memckpt.parse_key(key)) == memckpt.KEY_BYTES
    assert backend.start(_request(previous))[memckpt.HANDLE_KEY] == key
    # No memory tier, no key.
    (tmp_path / "other").mkdir()
    assert memckpt.HANDLE_KEY not in backend.start(_request({"root": str(tmp_path / "other"), "hosts": ["algo-1"]}))


def test_an_in_place_attempt_gives_a_spare_the_replaced_node_s_slot(tmp_path):
    import dataclasses

    root = tmp_path / "jobs" / "warm-1" / "attempt-1"
    previous = {"root": str(root), "hosts": ["algo-1", "algo-2"], "spares": ["algo-3", "algo-4"]}
    root.mkdir(parents=True)
    (root / "algo-2").mkdir()  # the lost node's folder: its name is never a new spare's
    spec = JobSpec.from_dict(
        {"name": "warm", "entrypoint": ["python"], "resources": {"instance_count": 2, "spare_nodes": 2}}
    )
    request = dataclasses.replace(
        _request(previous), spec=spec, replace_nodes={"algo-2": "algo-3"}, exclude_nodes=("algo-2",)
    )
    backend = LocalBackend(tmp_path / "jobs")
    spawned: list[tuple[str, bool]] = []
    # The new spare's process tree is the e2e test's (tests/e2e/test_spares.py): here, which slot.
    backend._spawn = lambda req, root, host, hosts, *, spare, peers, key=None, master_port, net=None: spawned.append(  # type: ignore[method-assign]
        (host, spare)
    )
    handle = backend.start(request)
    assert handle["hosts"] == ["algo-1", "algo-3"] and handle["replaced_nodes"] == {"algo-2": "algo-3"}
    # The used spare is replaced from the pool (5 slots: 2 nodes, 2 spares, 1 to spare).
    assert handle["spares"] == ["algo-4", "algo-5"] and spawned == [("algo-5", True)]
    assert backend.start(request) == handle and len(spawned) == 1  # idempotent: spawned once
    assert handle["master_addr"] == "127.0.0.1"  # rank 0's node (no network namespaces: loopback)


def test_a_spare_in_rank_0_s_slot_is_the_new_master_address():
    from orchestrator.backends.local_layout import master_addr

    netns = {"nodes": {h: {"host": h, "ip": f"10.9.0.{i}"} for i, h in enumerate(["algo-1", "algo-2", "algo-3"], 2)}}
    assert master_addr({"hosts": ["algo-3", "algo-2"], "netns": netns}) == "10.9.0.4"
    assert master_addr({"hosts": ["algo-3", "algo-2"]}) == "127.0.0.1"
