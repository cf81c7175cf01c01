"""A running attempt's health verdicts, from what its nodes report: lost, straggler, NaN replay.

Kept apart from the loop because each verdict keeps a little memory between passes (when the
machines were first seen allocated, who has been an outlier since when, which replays were judged),
all of it safe to lose: a restarted control plane starts these clocks again.
"""

from __future__ import annotations

import logging
import time

from aerie_contracts.failures import FailureKind, reason
from aerie_contracts.health import HealthSettings
from aerie_contracts.states import AttemptState
from orchestrator import liveness
from orchestrator.backends.base import PollResult
from orchestrator.settings import Settings
from orchestrator.store import repo
from orchestrator.store.db import Database
from orchestrator.store.models import Attempt
from orchestrator.straggler import StragglerTracker
from recovery import nan_replay

log = logging.getLogger("aerie.controller")


class AttemptHealth:
    def __init__(self, db: Database, settings: Settings):
        self.db = db
        self.settings = settings
        # Per running attempt: when this controller first saw its machines allocated (the clock
        # of `health.first_heartbeat_s`).
        self.booted_at: dict[str, float] = {}
        self.stragglers = StragglerTracker()  # node.straggler: who has been an outlier since when
        self.replay_judged: set[str] = set()  # attempts whose NaN replay was decided

    def forget(self, attempt_id: str) -> None:
        """An attempt that ended: nothing more to judge of it."""
        self.booted_at.pop(attempt_id, None)
        self.stragglers.forget(attempt_id)

    def check_heartbeats(self, attempt_id: str, result: PollResult, started_at: float) -> PollResult:
        """`node.lost` (orchestrator/liveness.py): a node that stopped heartbeating for
        `lost_after_heartbeats` intervals, or that never sent one `health.first_heartbeat_s` after
        the backend first reported the attempt's machines allocated (`not result.queued`).
        `started_at`: when this controller started leading (heartbeats missed before are not the
        nodes' fault)."""
        now = time.time()
        if not result.queued:
            # Seen by this controller: one that (re)starts gives the nodes the whole limit again.
            self.booted_at.setdefault(attempt_id, now)
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
            if now - started_at >= limit:
                lost = liveness.stopped_reporting(heartbeats, {n.host: n.state for n in attempt.nodes}, now, limit)
            if lost is None and attempt_id in self.booted_at:
                expected = int((attempt.job.spec.get("resources") or {}).get("instance_count", 1))
                lost = liveness.never_reported(
                    heartbeats,
                    [(n.host, n.state) for n in result.nodes],
                    expected,
                    self.booted_at[attempt_id],
                    now,
                    health.first_heartbeat_s,
                )
            if lost is None:
                self.check_nan_replay(s, attempt)
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

    def check_nan_replay(self, s, attempt: Attempt, completed: bool = False) -> None:
        """An attempt that replays a `loss.nan` (recovery/nan_replay.py): once all its nodes are past
        the NaN's step with a finite loss (or it `completed`), the first NaN was not reproducible:
        `sdc.suspect` on the failed attempt, blaming the node whose rank produced it. Decided once
        per attempt."""
        cause = attempt.cause or {}
        if attempt.id in self.replay_judged or (cause.get("reason") or {}).get("kind") != FailureKind.LOSS_NAN:
            return
        failed = next((a for a in attempt.job.attempts if a.number == cause.get("failed_attempt")), None)
        rows = repo.verdicts_of(s, [failed.id]) if failed is not None else []
        verdicts = [{"attempt_id": v.attempt_id, "kind": v.kind, "host": v.host, "evidence": v.evidence} for v in rows]
        nan = nan_replay.first_nan(verdicts, failed.id) if failed is not None else None
        if nan is None or any(v["kind"] == FailureKind.SDC_SUSPECT for v in verdicts):
            self.replay_judged.add(attempt.id)
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
        self.replay_judged.add(attempt.id)
