"""The controller's half of an in-place restart: a failed attempt that may restart in place keeps
its agents (no `stop`); an in-place successor is launched with the failed attempt's handle; a
relaunch stops that handle's agents first; a restarted controller hands each running attempt's
rebuilt request back to a backend that `adopts` them. The backend records the calls (the local
backend's side runs on real processes: tests/orchestrator/backends/test_local_in_place.py,
test_local_spares.py and tests/e2e/test_in_place_restart.py)."""

from __future__ import annotations

from sqlalchemy import func, select

from aerie_contracts.restarts import CAUSE_MODE, CAUSE_REPLACED_NODES
from orchestrator.backends.base import Backend, NodeStatus, PollResult
from orchestrator.controller import Controller
from orchestrator.settings import Settings
from orchestrator.store import Database, repo
from orchestrator.store.models import Token

HANDLE = {"root": "/nowhere", "hosts": ["algo-1", "algo-2"]}


class Recorder(Backend):
    name = "local"

    def __init__(self, outcome: PollResult | None = None):
        self.outcome, self.calls = outcome, []

    def launch(self, request):
        self.calls.append(("launch", request.attempt_number, request.in_place_of))
        return {**HANDLE, "attempt_id": request.attempt_id}

    restart_in_place = launch  # recorded alike: what was asked is in `in_place_of`

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


def test_a_restarted_controller_hands_each_running_attempt_it_did_not_launch_back_once(aerie_home):
    """The local backend replaces a dead hot spare with the request its attempt was launched with,
    which lives in memory only (it holds the agent token): a controller hands the backend each
    running attempt it finds but did not launch (`Backend.adopt`), rebuilt as its launch built it
    (a new token for that attempt; an in-place attempt's failed handle and swaps), before it first
    polls it and only once; not an attempt it launched itself, nor to a backend that does not adopt."""

    class Adopter(Recorder):
        adopts = True

        def adopt(self, request, handle):
            self.requests.append(request)
            self.calls.append(("adopt", request.attempt_number, handle["attempt_id"]))

        def poll(self, handle):
            self.calls.append(("poll", handle["attempt_id"]))
            return super().poll(handle)

    db = Database(Settings().db_url)
    job_id = _job(db)
    with db.session() as s:
        job = repo.get_job(s, "default", job_id)
        first = job.attempts[0]
        repo.set_attempt_state(s, first, "Failed", {"kind": "exit.nonzero"})
        second = repo.create_attempt(s, job, 2)
        second.cause = {CAUSE_MODE: "in_place", CAUSE_REPLACED_NODES: {"algo-2": "algo-3"}}
        repo.set_attempt_state(s, second, "Running")
        second.handle = {**HANDLE, "attempt_id": second.id, "in_place": True}
        second_id, first_handle = second.id, dict(first.handle)
        launched = repo.create_job(s, {"name": "k", "backend": "local", "entrypoint": ["x"]}, "default")
        repo.set_job_state(s, launched, "InProgress")
        repo.create_attempt(s, launched, 1)  # pending: launched by the controller itself
        launched_id = launched.id

    backend = Adopter()
    backend.requests = []
    controller = Controller(db, Settings(), {"local": backend}, chaining=True)
    controller.reconcile_once()
    controller.reconcile_once()
    adopted = [c for c in backend.calls if c[0] == "adopt"]
    assert adopted == [("adopt", 2, second_id)]  # once, and never the attempt it launched
    assert backend.calls.index(("adopt", 2, second_id)) < backend.calls.index(("poll", second_id))
    (request,) = backend.requests
    assert request.attempt_id == second_id and request.job_id == job_id and request.api_url == Settings().api_url
    assert request.in_place_of == first_handle and request.replace_nodes == {"algo-2": "algo-3"}
    with db.session() as s:
        token = repo.find_token(s, request.agent_token)
        assert token is not None and token.kind == "agent" and token.attempt_id == second_id

    # Another restart hands both back (the one launched before it too); a backend that does not
    # adopt gets nothing, and no token is minted for it.
    with db.session() as s:
        other = repo.get_job(s, "default", launched_id).attempts[0].id
        tokens = s.scalar(select(func.count()).select_from(Token))
    again = Adopter()
    again.requests = []
    Controller(db, Settings(), {"local": again}, chaining=True).reconcile_once()
    assert sorted(c[2] for c in again.calls if c[0] == "adopt") == sorted([second_id, other])

    class Ignorer(Adopter):
        adopts = False

    plain = Ignorer()
    plain.requests = []
    Controller(db, Settings(), {"local": plain}, chaining=True).reconcile_once()
    assert plain.requests == []
    with db.session() as s:
        assert s.scalar(select(func.count()).select_from(Token)) == tokens + 2  # `again`'s two
    db.dispose()
