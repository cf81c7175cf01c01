"""The reconcile loop: make every job's attempts match what the store says they should be.

Each pass reads the store, acts on backends, and writes state changes with their events in one
transaction. It keeps nothing important in memory: a control plane killed with SIGKILL and
started again picks up exactly where the store says it was (attempts being launched are launched
idempotently, running ones re-adopted through their backend handle).

This module holds the loop, its leadership and the order of a pass's steps, and the steps that act
on backends (launch, adopt, poll, fence, stop); what they decide with lives apart: stop requests
and StoppingCondition limits (controller_limits.py), a launch's request (controller_launch.py),
node health verdicts (controller_health.py) and a poll's result into the store
(controller_outcomes.py). The outbox is delivered in the same loop (`Dispatcher`, events.py).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time

from aerie_contracts.failures import FailureKind
from aerie_contracts.preflight import HANDLE_SPARE_PREFLIGHT
from aerie_contracts.restarts import IN_PLACE_BACKENDS
from aerie_contracts.states import AttemptState, JobState
from orchestrator import controller_outcomes as outcomes
from orchestrator import failpoints
from orchestrator.backends import base
from orchestrator.backends.base import Backend, PollResult
from orchestrator.controller_health import AttemptHealth
from orchestrator.controller_launch import launch_request, previous_handle, waiting_spares
from orchestrator.controller_limits import enforce_stopping, handle_stop_requests
from orchestrator.events import Dispatcher
from orchestrator.leader import LeaderLock
from orchestrator.settings import Settings
from orchestrator.store import repo
from orchestrator.store.db import Database
from orchestrator.store.models import Job
from recovery import modes

log = logging.getLogger("aerie.controller")


class Controller:
    def __init__(
        self,
        db: Database,
        settings: Settings,
        backends: dict[str, Backend],
        chaining: bool = False,
        dispatcher: Dispatcher | None = None,
        leader_lock: LeaderLock | None = None,
    ):
        self.db = db
        self.settings = settings
        self.backends = backends
        # Outbox delivery runs in the same loop, so it too happens only on the leader.
        self.dispatcher = dispatcher
        self.leader_lock = leader_lock
        self.leading = leader_lock is None
        # With chaining, the chain_restart handler decides what a failed attempt means for its
        # job (restart or fail); without it a failed attempt fails the job.
        self.chaining = chaining
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # Heartbeats missed while this control plane was down are not the nodes' fault.
        self._started_at = time.time()
        self.health = AttemptHealth(db, settings)  # node.lost, node.straggler, NaN replays
        # Running attempts whose backend holds what launched them: launched by this process, or
        # handed back once after a restart (`_adopt`).
        self._adopted: set[str] = set()

    # --- loop -----------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name="controller", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=10)
        if self.dispatcher is not None:
            self.dispatcher.stop()  # its slow-handler workers; what they had not finished stays pending

    def run(self) -> None:
        while not self._stop.is_set():
            try:
                if self._lead():
                    self.reconcile_once()
                    if self.dispatcher is not None:
                        # Fast: slow handlers (eval) run on the dispatcher's own workers.
                        self.dispatcher.deliver_once()
            except Exception:  # keep reconciling: one bad job must not stop the others
                log.exception("reconcile pass failed")
            self._stop.wait(self.settings.reconcile_interval_s)
        if self.leader_lock is not None:
            self.leader_lock.release()

    def _lead(self) -> bool:
        """Take or keep leadership; only the leader launches, polls and delivers."""
        if self.leader_lock is None:
            return True
        try:
            held = self.leader_lock.try_acquire()
        except Exception:
            log.exception("leader election failed")
            held = False
        if held and not self.leading:
            log.warning("this control plane now leads the reconcile loop")
            self._started_at = time.time()  # heartbeats missed before we led are not the nodes' fault
            self.health.booted_at.clear()
        self.leading = held
        return held

    def reconcile_once(self) -> None:
        self._start_submitted()
        enforce_stopping(self.db)
        handle_stop_requests(self.db, self._backend)
        self._launch_pending()
        self._poll_running()
        with self.db.session() as s:
            decided = bool(repo.attempts_in(s, {AttemptState.PENDING}))
        if decided:
            # A failure this pass chained a next attempt: launch it now, not a reconcile interval
            # later (an in-place successor's agents are waiting on GET .../next for it).
            self._launch_pending()

    # --- steps ----------------------------------------------------------------------------

    def _start_submitted(self) -> None:
        with self.db.session() as s:
            for job in repo.list_jobs_in_state(s, JobState.SUBMITTED):
                if job.stop_requested:
                    continue
                repo.create_attempt(s, job, 1)
                repo.set_job_state(s, job, JobState.IN_PROGRESS)

    def _launch_pending(self) -> None:
        with self.db.session() as s:
            todo = [a.id for a in repo.attempts_in(s, {AttemptState.PENDING, AttemptState.LAUNCHING})]
        for attempt_id in todo:
            with self.db.session() as s:
                attempt = repo.get_attempt(s, attempt_id)
                job = attempt.job
                if attempt.state == AttemptState.PENDING:
                    repo.set_attempt_state(s, attempt, AttemptState.LAUNCHING)
                request = launch_request(s, self.settings, job, attempt)
                previous = previous_handle(job, attempt)
                if request.in_place_of is None and previous is not None and job.backend in IN_PLACE_BACKENDS:
                    # A relaunch after a failure whose agents were kept up for a warm restart; its
                    # hot spares still waiting are the new attempt's (local), not stopped.
                    self._stop_nodes(job.backend, previous)
                    kept = waiting_spares(self._backend(job), previous)
                    request = dataclasses.replace(request, reuse_spares=kept)
            failpoints.hit("controller.before_launch")
            # Outside the transaction: launching can take a while and must not hold locks.
            try:
                handle = self._backend(job).start(request)
                failpoints.hit("controller.after_launch")
            except Exception as exc:
                log.exception("launch of %s failed", attempt_id)
                with self.db.session() as s:
                    attempt = repo.get_attempt(s, attempt_id)
                    # A backend error may name its own kind (placement.failed: too few usable nodes).
                    reason = {
                        "kind": getattr(exc, "failure_kind", FailureKind.LAUNCH_FAILED),
                        "message": str(exc)[:500],
                    }
                    repo.set_attempt_state(s, attempt, AttemptState.FAILED, reason)
                    outcomes.attempt_failed(s, attempt, reason, self.chaining)
                continue
            with self.db.session() as s:
                attempt = repo.get_attempt(s, attempt_id)
                # Spares' own pre-flight results are this attempt's (an in-place handle, copied from
                # the last one, drops the last one's); a spare may have reported before this.
                handle = {k: v for k, v in handle.items() if k != HANDLE_SPARE_PREFLIGHT}
                early = (attempt.handle or {}).get(HANDLE_SPARE_PREFLIGHT)
                attempt.handle = {**handle, HANDLE_SPARE_PREFLIGHT: early} if early else handle
                repo.set_attempt_state(s, attempt, AttemptState.RUNNING)
            self._adopted.add(attempt_id)

    def _adopt(self, backend: Backend, attempt_id: str, handle: dict) -> None:
        """A running attempt this process did not launch (the control plane restarted, or another
        one led when it was launched): its backend gets its request back (`Backend.adopt`; the
        local one replaces dead hot spares with it), once, before this process first polls it."""
        self._adopted.add(attempt_id)  # once: a failure is logged, not retried (and minted) each pass
        if not getattr(backend, "adopts", False):
            return  # no token minted for a backend that would drop it
        try:
            with self.db.session() as s:
                attempt = repo.get_attempt(s, attempt_id)
                request = launch_request(s, self.settings, attempt.job, attempt)
            backend.adopt(request, handle)
        except Exception:
            log.exception("adopting %s failed: its dead hot spares are not replaced", attempt_id)

    def _poll_running(self) -> None:
        with self.db.session() as s:
            running = [(a.id, a.handle, a.job.backend) for a in repo.attempts_in(s, {AttemptState.RUNNING})]
        for attempt_id, handle, backend_name in running:
            backend = self.backends[backend_name]
            if attempt_id not in self._adopted:
                self._adopt(backend, attempt_id, handle)
            try:
                result = backend.poll(handle)
            except Exception:
                log.exception("poll of %s failed", attempt_id)
                continue
            if result.spares_replaced:
                outcomes.spares_replaced(self.db, attempt_id, result)
            if backend.outcomes_from_agents(handle):
                result = base.with_reported_exits(result, outcomes.reported_exits(self.db, attempt_id))
            if not result.terminal:
                result = self.health.check_heartbeats(attempt_id, result, self._started_at)
            if result.state == AttemptState.FAILED:
                self._fence_lost(backend, handle, result)  # first: a crash after it re-detects and re-fences
            outcomes.record_poll(self.db, attempt_id, result, self.chaining)
            if result.state == AttemptState.COMPLETED:
                # A replay that ran to the end between two heartbeats is judged all the same.
                with self.db.session() as s:
                    self.health.check_nan_replay(s, repo.get_attempt(s, attempt_id), completed=True)
            if result.terminal:
                self.health.forget(attempt_id)
                self._adopted.discard(attempt_id)
            if result.state == AttemptState.FAILED and not self._keeps_warm(attempt_id, backend_name, result):
                self._stop_nodes(backend_name, handle)  # the surviving nodes would only wait for their dead peer

    def _stop_nodes(self, backend_name: str, handle: dict) -> None:
        """Stop a failed attempt's nodes. A local attempt's hot spares go on waiting: a relaunch
        keeps them (`waiting_spares`); otherwise GET .../next ends them (the job ended, or the
        relaunch did not keep them)."""
        backend = self.backends[backend_name]
        keep = getattr(backend, "keeps_spares", False) and handle.get("spares")
        backend.stop({**handle, "spares": []} if keep else handle)

    def _keeps_warm(self, attempt_id: str, backend_name: str, result: PollResult) -> bool:
        """Whether a failed attempt's agents stay up for chaining to restart it in place: they stop
        their own ranks (the heartbeat's answer says the attempt is over) and ask what comes next;
        a relaunch stops them first (`_launch_pending`), as does a job that ends."""
        if not self.chaining:
            return False
        with self.db.session() as s:
            attempt = repo.get_attempt(s, attempt_id)
            spec, spares = attempt.job.spec, list((attempt.handle or {}).get("spares") or [])
        return modes.keeps_warm(spec, backend_name, result.reason, spares)

    def _fence_lost(self, backend: Backend, handle: dict, result: PollResult) -> None:
        """A lost node may only be paused or cut off: kill what the backend can reach of it now,
        so it cannot come back as a zombie of this attempt (what it cannot reach, the store fences:
        this attempt is no longer current, so nothing it commits is recorded)."""
        reason = result.reason or {}
        if reason.get("kind") != FailureKind.NODE_LOST or not reason.get("host"):
            return
        try:
            backend.fence(handle, [reason["host"]])
        except Exception:
            log.exception("fencing %s failed", reason["host"])

    def _backend(self, job: Job) -> Backend:
        try:
            return self.backends[job.backend]
        except KeyError:
            raise RuntimeError(f"backend {job.backend!r} is not configured on this control plane") from None
