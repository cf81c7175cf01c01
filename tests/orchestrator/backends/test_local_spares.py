"""The local backend's hot-spare pool between launches (issue #23): a spare whose tree died while it
waited is replaced by `poll` on the next free slot (the changed handle goes back to the controller),
by a restarted control plane's backend too once the attempt's request was handed back (`adopt`),
and a relaunch keeps the previous attempt's spares that still wait instead of starting new ones.
Real processes stand for the agents (their command line names `agent`); `_spawn` records instead of
starting agent trees."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from aerie_contracts import env as E
from orchestrator.backends.base import LaunchRequest
from orchestrator.backends.local import LocalBackend
from orchestrator.backends.local_procs import alive
from orchestrator.controller_launch import waiting_spares
from orchestrator.spec import JobSpec


@pytest.fixture
def agents():
    procs: list[subprocess.Popen] = []

    def start(node: Path) -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "agent"])
        procs.append(proc)
        (node / "agent").mkdir(parents=True, exist_ok=True)
        (node / "agent" / "agent.pid").write_text(str(proc.pid))
        return proc

    yield start
    for p in procs:
        p.kill()
        p.wait()


@pytest.fixture
def backend(tmp_path, monkeypatch, agents):
    return _recording(tmp_path, monkeypatch, agents)


def _recording(tmp_path: Path, monkeypatch, agents) -> LocalBackend:
    """A local backend over the jobs folder under `tmp_path` whose `_spawn` starts a stand-in agent
    and records (attempt number, host, spare) in `spawned`, and in `started` (host, agent token,
    rendezvous port). A second one over the same folder is a restarted control plane's."""
    monkeypatch.setenv(E.MEMORY_CHECKPOINT_DIR.name, str(tmp_path / "shm"))
    local = LocalBackend(tmp_path / "jobs")
    local.spawned, local.started = [], []

    def spawn(request, root, host, hosts, *, spare, master_port, **_kw):
        local.spawned.append((request.attempt_number, host, spare))
        local.started.append((host, request.agent_token, master_port))
        agents(root / host)

    monkeypatch.setattr(local, "_spawn", spawn)
    return local


def _request(number: int, token: str = "tok", slots: int | None = None, **kw) -> LaunchRequest:
    spec = JobSpec.from_dict(
        {
            "name": "sp",
            "entrypoint": ["python"],
            "resources": {"instance_count": 2, "spare_nodes": 1},
            "retry": {"max_restarts": 2},
            "checkpoint": {"memory_every_steps": 10},
            **({"backend_options": {"node_slots": slots}} if slots else {}),
        }
    )
    return LaunchRequest("sp-1", "sp", f"sp-1-a{number}", number, spec, "http://127.0.0.1:9", token, **kw)


def _kill(node: Path) -> None:
    import os
    import signal

    pid = int((node / "agent" / "agent.pid").read_text())
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)


def test_a_spare_that_dies_while_it_waits_is_replaced_on_the_next_free_slot(backend):
    handle = backend.start(_request(1))
    root = Path(handle["root"])
    assert handle["hosts"] == ["algo-1", "algo-2"] and handle["spares"] == ["algo-3"]
    first = backend.poll(handle)
    assert first.state == "Running" and first.spares_replaced == {} and first.handle is None

    _kill(root / "algo-3")
    result = backend.poll(handle)
    assert result.state == "Running" and result.spares_replaced == {"algo-3": "algo-4"}
    new = result.handle
    assert new is not None and new["spares"] == ["algo-4"] and new["hosts"] == ["algo-1", "algo-2"]
    assert "algo-4" in new["memory_peers"] and (1, "algo-4", True) in backend.spawned
    assert backend.poll(new).spares_replaced == {}  # the new one lives: nothing more

    _kill(root / "algo-4")  # the pool (node_slots 4) has no slot left: dropped, none started
    last = backend.poll(new)
    assert last.spares_replaced == {"algo-4": ""} and last.handle["spares"] == []


def test_a_relaunch_keeps_the_spares_still_waiting_and_starts_only_its_own_nodes(backend):
    first = backend.start(_request(1))
    backend.stop({**first, "spares": []})  # what the controller does to a failed local attempt
    kept = waiting_spares(backend, first)
    assert kept == {"algo-3": {"root": first["root"], "peer": first["memory_peers"]["algo-3"]}}
    backend.spawned.clear()

    handle = backend.start(_request(2, exclude_nodes=("algo-2",), reuse_spares=kept))
    assert handle["hosts"] == ["algo-1", "algo-4"] and handle["spares"] == ["algo-3"]
    assert handle["node_roots"] == {"algo-3": first["root"]}
    assert handle["memory_peers"]["algo-3"] == first["memory_peers"]["algo-3"]  # where it serves
    assert backend.spawned == [(2, "algo-1", False), (2, "algo-4", False)]  # no new spare
    assert waiting_spares(backend, handle) == {"algo-3": {"root": first["root"], "peer": kept["algo-3"]["peer"]}}

    # Dead by then: not kept; a new spare tree starts in the new attempt's folder instead.
    _kill(Path(first["root"]) / "algo-3")
    backend.spawned.clear()
    third = backend.start(_request(3, reuse_spares=waiting_spares(backend, handle)))
    assert third["hosts"] == ["algo-1", "algo-2"] and third["spares"] == ["algo-3"] and "node_roots" not in third
    assert (3, "algo-3", True) in backend.spawned


def _poll_until_replaced(local: LocalBackend, handle: dict, timeout_s: float = 10.0):
    deadline = time.monotonic() + timeout_s
    while True:
        result = local.poll(handle)
        if result.spares_replaced or time.monotonic() > deadline:
            return result
        time.sleep(0.1)


def _agent_alive(node: Path) -> bool:
    return alive(int((node / "agent" / "agent.pid").read_text()), "agent")


def test_a_restarted_control_plane_replaces_a_dead_spare_once_the_attempt_is_handed_back(tmp_path, monkeypatch, agents):
    """A new backend instance (a restarted control plane: nothing in memory) cannot replace a dead
    spare until the controller hands it the attempt's rebuilt request (`adopt`); then it does, with
    that request's new token, on the rendezvous port the launch recorded in the handle."""
    first = _recording(tmp_path, monkeypatch, agents)
    handle = first.start(_request(1))
    root = Path(handle["root"])
    assert handle["spares"] == ["algo-3"] and isinstance(handle["master_port"], int)

    restarted = _recording(tmp_path, monkeypatch, agents)
    _kill(root / "algo-3")
    assert restarted.poll(handle).spares_replaced == {}  # no request to start one with yet
    assert restarted.spawned == []

    restarted.adopt(_request(1, token="tok-after-restart"), handle)
    result = _poll_until_replaced(restarted, handle)
    assert result.state == "Running" and result.spares_replaced == {"algo-3": "algo-4"}
    new = result.handle
    assert new is not None and new["spares"] == ["algo-4"] and new["hosts"] == ["algo-1", "algo-2"]
    assert "algo-4" in new["memory_peers"] and new["master_port"] == handle["master_port"]
    assert restarted.started == [("algo-4", "tok-after-restart", handle["master_port"])]
    assert _agent_alive(root / "algo-4") and not _agent_alive(root / "algo-3")
    assert restarted.poll(new).spares_replaced == {}  # the new one lives: nothing more
    assert ("algo-4", "tok", handle["master_port"]) not in first.started


def test_a_restarted_control_plane_replaces_an_in_place_attempt_s_dead_spare(tmp_path, monkeypatch, agents):
    """An in-place attempt's request is looked up by its own attempt id (its handle is the failed
    attempt's folder): the adopted one replaces its replenished spare on its own port."""
    first = _recording(tmp_path, monkeypatch, agents)
    failed = first.start(_request(1, slots=5))
    request = _request(2, slots=5, in_place_of=failed, replace_nodes={"algo-2": "algo-3"})
    handle = first.start(request)
    assert handle["hosts"] == ["algo-1", "algo-3"] and handle["spares"] == ["algo-4"]
    assert handle["master_port"] != failed["master_port"]

    restarted = _recording(tmp_path, monkeypatch, agents)
    restarted.adopt(_request(2, "tok-2", slots=5, in_place_of=failed, replace_nodes={"algo-2": "algo-3"}), handle)
    _kill(Path(handle["root"]) / "algo-4")
    result = _poll_until_replaced(restarted, handle)
    assert result.spares_replaced == {"algo-4": "algo-5"} and result.handle["spares"] == ["algo-5"]
    assert restarted.spawned == [(2, "algo-5", True)]
    assert restarted.started == [("algo-5", "tok-2", handle["master_port"])]
    assert _agent_alive(Path(handle["root"]) / "algo-5")
