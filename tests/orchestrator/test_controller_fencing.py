"""The controller fences a lost node: `backend.fence(handle, [host])` before the failure is recorded
(a control plane that dies in between re-detects the loss and fences again), then `stop`.

The backend here is a recorder of the calls the controller makes (the real backends' fences are
tested on real processes: tests/orchestrator/backends/test_local_kill.py, the Slurm cluster in
tests/integration/test_slurm_backend.py, and end to end in tests/e2e/test_fencing.py)."""

from __future__ import annotations

import time

from orchestrator.backends.base import Backend, NodeStatus, PollResult
from orchestrator.controller import Controller
from orchestrator.settings import Settings
from orchestrator.store import Database, repo


class Recorder(Backend):
    name = "local"

    def __init__(self, db: Database, attempt_id: str):
        self.db, self.attempt_id, self.calls = db, attempt_id, []

    def launch(self, request):
        raise AssertionError("nothing to launch")

    def poll(self, handle):
        return PollResult("Running", (NodeStatus("algo-1", "Running"), NodeStatus("algo-2", "Running")))

    def fence(self, handle, hosts):
        with self.db.session() as s:  # what the store said when the fence ran
            self.calls.append(("fence", hosts, repo.get_attempt(s, self.attempt_id).state))

    def stop(self, handle):
        self.calls.append(("stop",))

    def logs(self, handle, offsets=None, max_bytes=1 << 20):
        return {}


def _running_attempt_with_a_silent_node(db: Database, *, stop_requested: bool = False) -> str:
    """A Running attempt of two nodes, algo-2's last heartbeat a minute old."""
    with db.session() as s:
        job = repo.create_job(s, {"name": "j", "backend": "local", "health": {"heartbeat_s": 1}}, "default")
        repo.set_job_state(s, job, "InProgress")
        job.stop_requested = stop_requested
        attempt = repo.create_attempt(s, job, 1)
        repo.set_attempt_state(s, attempt, "Running")
        attempt.handle = {"root": "/nowhere", "hosts": ["algo-1", "algo-2"]}
        for host, age in (("algo-1", 0.0), ("algo-2", 60.0)):
            repo.record_heartbeat(s, attempt, host, {}).last_heartbeat_at = time.time() - age
        return attempt.id


def test_a_lost_node_is_fenced_before_its_attempt_is_failed(aerie_home):
    settings = Settings()
    db = Database(settings.db_url)
    attempt_id = _running_attempt_with_a_silent_node(db)
    backend = Recorder(db, attempt_id)
    controller = Controller(db, settings, {"local": backend})
    controller._started_at -= 3600  # as if it had been up long enough to judge heartbeats
    controller.reconcile_once()
    assert backend.calls == [("fence", ["algo-2"], "Running"), ("stop",)]
    with db.session() as s:
        failed = repo.get_attempt(s, attempt_id)
        assert failed.state == "Failed" and failed.reason["kind"] == "node.lost" and failed.reason["host"] == "algo-2"
    db.dispose()


def test_a_node_that_goes_quiet_while_its_job_stops_on_request_is_not_lost(aerie_home):
    """A stop tears the nodes down: their heartbeats end before the backend reports them stopped,
    and the attempt must end Stopped, not Failed with node.lost."""
    settings = Settings()
    db = Database(settings.db_url)
    attempt_id = _running_attempt_with_a_silent_node(db, stop_requested=True)
    backend = Recorder(db, attempt_id)
    controller = Controller(db, settings, {"local": backend})
    controller._started_at -= 3600
    controller.reconcile_once()
    assert ("stop",) in backend.calls and not [c for c in backend.calls if c[0] == "fence"]
    with db.session() as s:
        attempt = repo.get_attempt(s, attempt_id)
        assert attempt.state == "Running" and attempt.reason is None, attempt.reason
    db.dispose()
