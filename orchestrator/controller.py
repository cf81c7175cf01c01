"""The reconcile loop: make every job's attempts match what the store says they should be.

Each pass reads the store, acts on backends, and writes state changes with their events in one
transaction. It keeps nothing important in memory: a control plane killed with SIGKILL and
started again picks up exactly where the store says it was (attempts being launched are launched
idempotently, running ones re-adopted through their backend handle).

Over 400 lines on purpose: one pass's steps (stop requests, launches, polls, heartbeats, fencing,
in-place hand-overs, spares) share the same store session pattern and ordering rules, and reading
them in one place is what shows why each runs where it does.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from typing import cast

from aerie_contracts.events import DetailType
from aerie_contracts.failures import STOPPED_ON_REQUEST, FailureKind, FailureReason, reason, stop_limit
from aerie_contracts.health import HealthSettings
from aerie_contracts.preflight import HANDLE_SPARE_PREFLIGHT
from aerie_contracts.restarts import CAUSE_REPLACED_NODES, IN_PLACE_BACKENDS, RestartMode, mode_of
from aerie_contracts.states import ATTEMPT_ACTIVE, AttemptState, JobState
from orchestrator import failpoints, liveness, stopping
from orchestrator.backends import base
from orchestrator.backends.base import Backend, LaunchRequest, PollResult, first_reported_cause
from orchestrator.backends.nodeenv import memory_resume_env
from orchestrator.events import Dispatcher
from orchestrator.goodput.advice import checkpoint_mtbf_env
from orchestrator.leader import LeaderLock
from orchestrator.learned import learned_env
from orchestrator.settings import Settings
from orchestrator.spec import JobSpec
from orchestrator.store import repo
from orchestrator.store.db import Database
from orchestrator.store.models import Attempt, Job
from orchestrator.straggler import StragglerTracker
from recovery import modes, nan_replay

log = logging.getLogger("aerie.controller")

ACTIVE = ATTEMPT_ACTIVE


def _stopped_on_request() -> FailureReason:
    """The reason of a job or attempt the user stopped (a fresh dict: reasons are stored as is)."""
    return {"kind": FailureKind.USER_STOP, "message": STOPPED_ON_REQUEST}


def _stop_reason(job: Job) -> FailureReason:
    """Why a job that ends Stopped stopped: the StoppingCondition limit that ran out
    (`_enforce_stopping` left it on the job), else the user's request."""
    return cast(FailureReason, dict(job.reason or {})) if stop_limit(job.reason) else _stopped_on_request()


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
        # Per running attempt: when this controller first saw its machines allocated (the clock
        # of `health.first_heartbeat_s`).
        self._booted_at: dict[str, float] = {}
        self.stragglers = StragglerTracker()  # node.straggler: who has been an outlier since when
        self._replay_judged: set[str] = set()  # attempts whose NaN replay was decided
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
            self._booted_at.clear()
        self.leading = held
        return held

    def reconcile_once(self) -> None:
        self._start_submitted()
        self._enforce_stopping()
        self._handle_stop_requests()
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

    def _enforce_stopping(self) -> None:
        """StoppingCondition (orchestrator/stopping.py): a job over its max_runtime_s or max_wait_s
        is stopped the way a user's stop stops it (`stop_requested`, handled next), with the
        limit's reason on the job; decided once (a stopping job is not looked at again, so a user's
        stop before or after it changes nothing). Not on the sagemaker backend: SageMaker enforces
        the training job's StoppingCondition itself, and its poll reports the same reasons."""
        now = time.time()
        with self.db.session() as s:
            for state in (JobState.SUBMITTED, JobState.IN_PROGRESS):
                for job in repo.list_jobs_in_state(s, state):
                    if job.stop_requested or job.backend == "sagemaker":
                        continue
                    spans = [(a.started_at, a.ended_at) for a in job.attempts]
                    why = stopping.exceeded(job.spec.get("stopping"), job.created_at, spans, now)
                    if why is None:
                        continue
                    log.warning("job %s: %s: stopping it", job.id, why["message"])
                    job.reason = why
                    job.stop_requested = True

    def _handle_stop_requests(self) -> None:
        with self.db.session() as s:
            for job in repo.jobs_stopping(s):
                live = [a for a in job.attempts if a.state in ACTIVE]
                for attempt in live:
                    if attempt.state == AttemptState.RUNNING and attempt.handle:
                        self._backend(job).stop(attempt.handle)
                    else:
                        repo.set_attempt_state(s, attempt, AttemptState.STOPPED)
                if not any(a.state in {AttemptState.LAUNCHING, AttemptState.RUNNING} for a in job.attempts):
                    repo.set_job_state(s, job, JobState.STOPPED, _stop_reason(job))

    def _launch_pending(self) -> None:
        with self.db.session() as s:
            todo = [a.id for a in repo.attempts_in(s, {AttemptState.PENDING, AttemptState.LAUNCHING})]
        for attempt_id in todo:
            with self.db.session() as s:
                attempt = repo.get_attempt(s, attempt_id)
                job = attempt.job
                if attempt.state == AttemptState.PENDING:
                    repo.set_attempt_state(s, attempt, AttemptState.LAUNCHING)
                request = self._launch_request(s, job, attempt)
                previous_handle = self._previous_handle(job, attempt)
                if request.in_place_of is None and previous_handle is not None and job.backend in IN_PLACE_BACKENDS:
                    # A relaunch after a failure whose agents were kept up for a warm restart; its
                    # hot spares still waiting are the new attempt's (local), not stopped.
                    self._stop_nodes(job.backend, previous_handle)
                    kept = _waiting_spares(self._backend(job), previous_handle)
                    request = dataclasses.replace(request, reuse_spares=kept)
            failpoints.hit("controller.before_launch")
            # Outside the transaction: launching can take a while and must not hold locks.
            try:
                handle = self._backend(job).launch(request)
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
                    self._attempt_failed(s, attempt, reason)
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

    def _launch_request(self, s, job: Job, attempt: Attempt) -> LaunchRequest:
        """What `attempt` is launched with, from the store, with an agent token minted for it: one
        recipe for its launch and for the backend of a restarted control plane that adopts it
        running (`_adopt`), whose request is never stored (the token). An in-place attempt names
        the failed one's handle; which spares a relaunch keeps is its launch's own business."""
        token = repo.mint_token(s, "agent", tenant=job.tenant, attempt_id=attempt.id, name=f"agent for {attempt.id}")
        request = LaunchRequest(
            job_id=job.id,
            job_name=job.name,
            attempt_id=attempt.id,
            attempt_number=attempt.number,
            spec=JobSpec.model_validate(job.spec),
            api_url=self.settings.api_url,
            agent_token=token,
            resume_from=attempt.resume_from,
            exclude_nodes=tuple(attempt.exclude_nodes or ()),
            # What earlier attempts learned about section durations (learned timeouts).
            extra_env={
                **learned_env(job, attempt.number),
                **memory_resume_env(attempt.cause),
                **checkpoint_mtbf_env(s, job, time.time()),  # for checkpoint.every_steps: auto
            },
        )
        previous_handle = self._previous_handle(job, attempt)
        if mode_of(attempt.cause) == RestartMode.IN_PLACE and previous_handle is not None:
            swaps = (attempt.cause or {}).get(CAUSE_REPLACED_NODES) or {}
            replaced = {str(k): str(v) for k, v in swaps.items()}
            request = dataclasses.replace(request, in_place_of=previous_handle, replace_nodes=replaced)
        return request

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
                request = self._launch_request(s, attempt.job, attempt)
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
                self._spares_replaced(attempt_id, result)
            if backend.outcomes_from_agents(handle):
                result = base.with_reported_exits(result, self._reported_exits(attempt_id))
            if not result.terminal:
                result = self._check_heartbeats(attempt_id, result)
            if result.state == AttemptState.FAILED:
                self._fence_lost(backend, handle, result)  # first: a crash after it re-detects and re-fences
            self._record_poll(attempt_id, result)
            if result.state == AttemptState.COMPLETED:
                # A replay that ran to the end between two heartbeats is judged all the same.
                with self.db.session() as s:
                    self._check_nan_replay(s, repo.get_attempt(s, attempt_id), completed=True)
            if result.terminal:
                self._booted_at.pop(attempt_id, None)
                self._adopted.discard(attempt_id)
                self.stragglers.forget(attempt_id)
            if result.state == AttemptState.FAILED and not self._keeps_warm(attempt_id, backend_name, result):
                self._stop_nodes(backend_name, handle)  # the surviving nodes would only wait for their dead peer

    def _stop_nodes(self, backend_name: str, handle: dict) -> None:
        """Stop a failed attempt's nodes. A local attempt's hot spares go on waiting: a relaunch
        keeps them (`_waiting_spares`); otherwise GET .../next ends them (the job ended, or the
        relaunch did not keep them)."""
        backend = self.backends[backend_name]
        keep = getattr(backend, "keeps_spares", False) and handle.get("spares")
        backend.stop({**handle, "spares": []} if keep else handle)

    def _spares_replaced(self, attempt_id: str, result: PollResult) -> None:
        """The backend replaced hot spares that died while they waited: an event for each (the
        attempt's new handle is stored by `_record_poll`)."""
        with self.db.session() as s:
            attempt = repo.get_attempt(s, attempt_id)
            for dead, new in result.spares_replaced.items():
                why = f"hot spare {dead} died while it waited" + (f"; {new} started" if new else "; no free node")
                log.warning("%s: %s", attempt_id, why)
                detail = {"attempt_id": attempt.id, "attempt": attempt.number, "host": dead, "replacement": new}
                repo.emit(s, attempt.job, DetailType.SPARE_REPLACED, {**detail, "why": why})

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

    def _reported_exits(self, attempt_id: str) -> dict[str, dict]:
        """What the attempt's agents reported of their own exits (POST .../exit, with "t")."""
        with self.db.session() as s:
            return {n.host: n.exit for n in repo.get_attempt(s, attempt_id).nodes if "t" in (n.exit or {})}

    @staticmethod
    def _previous_handle(job: Job, attempt: Attempt) -> dict | None:
        """The handle of the attempt before `attempt` (whose nodes an in-place attempt reuses)."""
        previous = next((a for a in job.attempts if a.number == attempt.number - 1), None)
        return previous.handle if previous is not None else None

    def _check_heartbeats(self, attempt_id: str, result: PollResult) -> PollResult:
        """`node.lost` (orchestrator/liveness.py): a node that stopped heartbeating for
        `lost_after_heartbeats` intervals, or that never sent one `health.first_heartbeat_s` after
        the backend first reported the attempt's machines allocated (`not result.queued`)."""
        now = time.time()
        if not result.queued:
            # Seen by this controller: one that (re)starts gives the nodes the whole limit again.
            self._booted_at.setdefault(attempt_id, now)
        with self.db.session() as s:
            attempt = repo.get_attempt(s, attempt_id)
            if attempt.job.stop_requested:
                # The backend is tearing the nodes down on request: one that goes quiet now is not
                # lost, and the attempt ends Stopped (on Slurm, scancel ended one agent's heartbeats
                # seconds before the attempt was recorded stopped: it ended Failed, node.lost).
                return result
            health = HealthSettings.from_dict(attempt.job.spec.get("health"))
            heartbeats = {n.host: n.last_heartbeat_at for n in attempt.nodes}
            lost = None
            limit = self.settings.lost_after_heartbeats * health.heartbeat_s
            if now - self._started_at >= limit:
                lost = liveness.stopped_reporting(heartbeats, {n.host: n.state for n in attempt.nodes}, now, limit)
            if lost is None and attempt_id in self._booted_at:
                expected = int((attempt.job.spec.get("resources") or {}).get("instance_count", 1))
                lost = liveness.never_reported(
                    heartbeats,
                    [(n.host, n.state) for n in result.nodes],
                    expected,
                    self._booted_at[attempt_id],
                    now,
                    health.first_heartbeat_s,
                )
            if lost is None:
                self._check_nan_replay(s, attempt)
                return self._check_stragglers(s, attempt, health, result, now)
            if lost.host:
                repo.record_verdict(s, attempt, lost.host, FailureKind.NODE_LOST, lost.reason["message"], lost.evidence)
            return PollResult(AttemptState.FAILED, result.nodes, lost.reason)

    def _check_stragglers(
        self, s, attempt: Attempt, health: HealthSettings, result: PollResult, now: float
    ) -> PollResult:
        """`node.straggler` (orchestrator/straggler.py): a verdict and an event (`report`), or the
        attempt ends and chaining leaves the node out (`restart`: the failure names it)."""
        summaries = {n.host: n.summary for n in attempt.nodes if isinstance(n.summary, dict)}
        for found in self.stragglers.observe(attempt.id, summaries, health, now):
            log.warning("attempt %s: %s", attempt.id, found.message)
            repo.record_verdict(s, attempt, found.host, found.kind, found.message, found.evidence)
            if health.straggler == "restart":
                why = reason(FailureKind.NODE_STRAGGLER, found.message, host=found.host, evidence=found.evidence)
                return PollResult(AttemptState.FAILED, result.nodes, why)
        return result

    def _check_nan_replay(self, s, attempt: Attempt, completed: bool = False) -> None:
        """An attempt that replays a `loss.nan` (recovery/nan_replay.py): once all its nodes are past
        the NaN's step with a finite loss (or it `completed`), the first NaN was not reproducible:
        `sdc.suspect` on the failed attempt, blaming the node whose rank produced it. Decided once
        per attempt."""
        cause = attempt.cause or {}
        if attempt.id in self._replay_judged or (cause.get("reason") or {}).get("kind") != FailureKind.LOSS_NAN:
            return
        failed = next((a for a in attempt.job.attempts if a.number == cause.get("failed_attempt")), None)
        rows = repo.verdicts_of(s, [failed.id]) if failed is not None else []
        verdicts = [{"attempt_id": v.attempt_id, "kind": v.kind, "host": v.host, "evidence": v.evidence} for v in rows]
        nan = nan_replay.first_nan(verdicts, failed.id) if failed is not None else None
        if nan is None or any(v["kind"] == FailureKind.SDC_SUSPECT for v in verdicts):
            self._replay_judged.add(attempt.id)
            return
        summaries = {n.host: n.summary for n in attempt.nodes if isinstance(n.summary, dict)}
        found = nan_replay.sdc_suspect(nan, attempt.number, summaries, completed=completed)
        if found is None or failed is None:
            return
        verdict, blame = found
        log.warning("job %s: %s", attempt.job_id, verdict["message"])
        repo.record_verdict(s, failed, verdict["host"], verdict["kind"], verdict["message"], verdict["evidence"])
        if blame is not None:
            repo.record_blames(s, failed, [dict(blame)])
        self._replay_judged.add(attempt.id)

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

    def _record_poll(self, attempt_id: str, result: PollResult) -> None:
        with self.db.session() as s:
            attempt = repo.get_attempt(s, attempt_id)
            if result.handle is not None:
                # The backend learned where the attempt runs, or replaced a dead spare; the spares'
                # own pre-flight results (posted by the spares, not the backend's) are kept.
                kept = (attempt.handle or {}).get(HANDLE_SPARE_PREFLIGHT)
                handle = {**result.handle, **({HANDLE_SPARE_PREFLIGHT: kept} if kept else {})}
                if handle != attempt.handle:
                    attempt.handle = handle
            # What the agents reported themselves (POST .../exit, with "t") outranks the backend's view.
            reported = {n.host: n.exit for n in attempt.nodes if "t" in (n.exit or {})}
            for node in result.nodes:
                row = repo.node(s, attempt, node.host)
                row.state = node.state
                if (node.exit_code is not None or node.reason) and node.host not in reported:
                    row.exit = {"exit_code": node.exit_code, "reason": node.reason}
            if not result.terminal:
                return
            result = first_reported_cause(result, reported)
            job = attempt.job
            if result.state == AttemptState.STOPPED and not job.stop_requested and stop_limit(result.reason):
                job.reason = dict(result.reason or {})  # SageMaker stopped it for its StoppingCondition
            elif result.state == AttemptState.STOPPED and not job.stop_requested:
                # Nodes that stopped without being asked to have failed, as far as the job is concerned.
                result = PollResult(
                    AttemptState.FAILED,
                    result.nodes,
                    {"kind": FailureKind.NODE_LOST, "message": "nodes stopped unexpectedly"},
                )
            if result.state == AttemptState.STOPPED and stop_limit(job.reason):
                # Its agents only know they were asked to stop (user.stop): the attempt says why.
                result = dataclasses.replace(result, reason=_stop_reason(job))
            repo.set_attempt_state(s, attempt, result.state, result.reason, result.exit_code)
            if result.state == AttemptState.COMPLETED:
                repo.set_job_state(s, job, JobState.COMPLETED)
            elif result.state == AttemptState.STOPPED:
                repo.set_job_state(s, job, JobState.STOPPED, _stop_reason(job))
            else:
                self._attempt_failed(s, attempt, result.reason or {"kind": FailureKind.EXIT_NONZERO})

    def _attempt_failed(self, s, attempt: Attempt, reason: dict) -> None:
        job = attempt.job
        if job.stop_requested:
            repo.set_job_state(s, job, JobState.STOPPED, _stop_reason(job))
        elif not self.chaining:
            repo.set_job_state(s, job, JobState.FAILED, reason)
        # else: the chaining handler reacts to the attempt's Failed event and decides.

    def _backend(self, job: Job) -> Backend:
        try:
            return self.backends[job.backend]
        except KeyError:
            raise RuntimeError(f"backend {job.backend!r} is not configured on this control plane") from None


def _waiting_spares(backend: Backend, handle: dict) -> dict[str, dict[str, str]]:
    """The hot spares of a failed local attempt, for the relaunch to keep ({host: {"root": the
    folder their tree is under, "peer": their memory-tier endpoint}}); the backend checks they live."""
    if not getattr(backend, "keeps_spares", False):
        return {}
    roots, peers = handle.get("node_roots") or {}, handle.get("memory_peers") or {}
    return {
        h: {"root": str(roots.get(h) or handle["root"]), "peer": str(peers.get(h) or "")}
        for h in handle.get("spares") or []
    }
