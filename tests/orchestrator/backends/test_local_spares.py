"""The local backend's hot-spare pool between launches (issue #23): a spare whose tree died while it
waited is replaced by `poll` on the next free slot (the changed handle goes back to the controller),
and a relaunch keeps the previous attempt's spares that still wait instead of starting new ones.
Real processes stand for the agents (their command line names `agent`); `_spawn` records instead of
starting agent trees."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from aerie_contracts import env as E
from orchestrator.backends.base import LaunchRequest
from orchestrator.backends.local import LocalBackend
from orchestrator.controller import _waiting_spares
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
    monkeypatch.setenv(E.MEMORY_CHECKPOINT_DIR.name, str(tmp_path / "shm"))
    local = LocalBackend(tmp_path / "jobs")
    local.spawned = []

    def spawn(request, root, host, hosts, *, spare, **_kw):
        local.spawned.append((request.attempt_number, host, spare))
        agents(root / host)

    monkeypatch.setattr(local, "_spawn", spawn)
    return local


def _request(number: int, **kw) -> LaunchRequest:
    spec = JobSpec.from_dict(
        {
            "name": "sp",
            "entrypoint": ["python"],
            "resources": {"instance_count": 2, "spare_nodes": 1},
            "retry": {"max_restarts": 2},
            "checkpoint": {"memory_every_steps": 10},
        }
    )
    return LaunchRequest("sp-1", "sp", f"sp-1-a{number}", number, spec, "http://127.0.0.1:9", "tok", **kw)


def _kill(node: Path) -> None:
    import os
    import signal

    pid = int((node / "agent" / "agent.pid").read_text())
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)


def test_a_spare_that_dies_while_it_waits_is_replaced_on_the_next_free_slot(backend):
    handle = backend.launch(_request(1))
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
    first = backend.launch(_request(1))
    backend.stop({**first, "spares": []})  # what the controller does to a failed local attempt
    kept = _waiting_spares(backend, first)
    assert kept == {"algo-3": {"root": first["root"], "peer": first["memory_peers"]["algo-3"]}}
    backend.spawned.clear()

    handle = backend.launch(_request(2, exclude_nodes=("algo-2",), reuse_spares=kept))
    assert handle["hosts"] == ["algo-1", "algo-4"] and handle["spares"] == ["algo-3"]
    assert handle["node_roots"] == {"algo-3": first["root"]}
    assert handle["memory_peers"]["algo-3"] == first["memory_peers"]["algo-3"]  # where it serves
    assert backend.spawned == [(2, "algo-1", False), (2, "algo-4", False)]  # no new spare
    assert _waiting_spares(backend, handle) == {"algo-3": {"root": first["root"], "peer": kept["algo-3"]["peer"]}}

    # Dead by then: not kept; a new spare tree starts in the new attempt's folder instead.
    _kill(Path(first["root"]) / "algo-3")
    backend.spawned.clear()
    third = backend.launch(_request(3, reuse_spares=_waiting_spares(backend, handle)))
    assert third["hosts"] == ["algo-1", "algo-2"] and third["spares"] == ["algo-3"] and "node_roots" not in third
    assert (3, "algo-3", True) in backend.spawned
