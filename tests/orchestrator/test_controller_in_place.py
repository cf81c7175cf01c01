"""The controller's half of an in-place restart: a failed attempt that may restart in place keeps
its agents (no `stop`); an in-place successor is launched with the failed attempt's handle; a
relaunch stops that handle's agents first. The backend records the calls (the local backend's
side runs on real processes: tests/orchestrator/backends/test_local_in_place.py and
tests/e2e/test_in_place_restart.py)."""

from __future__ import annotations

from aerie_contracts.restarts import CAUSE_MODE
from orchestrator.backends.base import Backend, NodeStatus, PollResult
from orchestrator.controller import Controller
from orchestrator.settings import Settings
from orchestrator.store import Database, repo

HANDLE = {"root": "/nowhere", "hosts": ["algo-1", "algo-2"]}


class Recorder(Backend):
    name = "local"

    def __init__(self, outcome: PollResult | None = None):
        self.outcome, self.calls = outcome, []

    def launch(self, request):
        self.calls.append(("launch", request.attempt_number, request.in_place_of))
        return {**HANDLE, "attempt_id": request.attempt_id}

    def poll(self, handle):
        return self.outcome or PollResult("Running", (NodeStatus("algo-1", "Running"),))

    def stop(self, handle):
        self.calls.append(("stop", handle.get("attempt_id")))

    def logs(self, handle, offsets=None, max_bytes=1 << 20):
        return {}


def _job(db: Database, backend: str = "local") -> str:
    with db.session() as s:
        job = repo.create_job(s, {"name": "j", "backend": backend, "entrypoint": ["x"]}, "default")
        repo.set_job_state(s, job, "InProgress")
        attempt = repo.create_attempt(s, job, 1)
        repo.set_attempt_state(s, attempt, "Running")
        attempt.handle = {**HANDLE, "attempt_id": attempt.id}
        return job.id


def _failing(kind: str) -> PollResult:
    nodes = (NodeStatus("algo-1", "Failed", 1, {"kind": kind}), NodeStatus("algo-2", "Running"))
    return PollResult("Failed", nodes, {"kind": kind, "host": "algo-1"}, 1)


def test_a_failure_that_may_restart_in_place_keeps_the_agents_a_lost_node_does_not(aerie_home):
    db = Database(Settings().db_url)
    # node.lost: the fence (by default a stop), then the stop.
    for kind, calls in (("exit.nonzero", []), ("node.lost", [("stop", "j-"), ("stop", "j-")])):
        job_id = _job(db)
        backend = Recorder(_failing(kind))
        Controller(db, Settings(), {"local": backend}, chaining=True).reconcile_once()
        assert [(c[0], c[1][:2]) for c in backend.calls] == calls, kind
        with db.session() as s:
            assert repo.get_job(s, "default", job_id).attempts[0].state == "Failed"
    # Without chaining nobody would ever restart them: stopped as before.
    backend = Recorder(_failing("exit.nonzero"))
    _job(db)
    Controller(db, Settings(), {"local": backend}, chaining=False).reconcile_once()
    assert [c[0] for c in backend.calls] == ["stop"]
    db.dispose()


def test_an_in_place_successor_gets_the_old_handle_and_a_relaunch_stops_it_first(aerie_home):
    db = Database(Settings().db_url)
    for mode, expected in (("in_place", "launch-in-place"), ("relaunch", "stop-then-launch")):
        job_id = _job(db)
        with db.session() as s:
            job = repo.get_job(s, "default", job_id)
            repo.set_attempt_state(s, job.attempts[0], "Failed", {"kind": "exit.nonzero"})
            repo.create_attempt(s, job, 2).cause = {CAUSE_MODE: mode}
            first = job.attempts[0].id
        backend = Recorder()
        Controller(db, Settings(), {"local": backend}, chaining=True).reconcile_once()
        if expected == "launch-in-place":
            assert backend.calls == [("launch", 2, {**HANDLE, "attempt_id": first})]
        else:
            assert backend.calls == [("stop", first), ("launch", 2, None)]
    db.dispose()


def test_a_lost_node_with_a_hot_spare_waiting_keeps_the_survivors(aerie_home):
    """A hot spare may take the lost node's slot in place: the lost node is fenced, the others kept."""

    class Fencer(Recorder):
        def fence(self, handle, hosts):
            self.calls.append(("fence", hosts))

    db = Database(Settings().db_url)
    job_id = _job(db)
    with db.session() as s:
        attempt = repo.get_job(s, "default", job_id).attempts[0]
        attempt.handle = {**attempt.handle, "spares": ["algo-3"]}
    backend = Fencer(_failing("node.lost"))
    Controller(db, Settings(), {"local": backend}, chaining=True).reconcile_once()
    assert backend.calls == [("fence", ["algo-1"])]
    db.dispose()


def test_a_handle_the_backend_learned_more_of_is_stored(aerie_home):
    """Slurm knows its nodes only once the job runs: `PollResult.handle` replaces the stored one."""
    db = Database(Settings().db_url)
    job_id = _job(db)
    learned = {**HANDLE, "spares": ["algo-3"]}
    backend = Recorder(PollResult("Running", (NodeStatus("algo-1", "Running"),), handle=learned))
    Controller(db, Settings(), {"local": backend}, chaining=True).reconcile_once()
    with db.session() as s:
        assert repo.get_job(s, "default", job_id).attempts[0].handle == learned
