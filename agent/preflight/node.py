"""The node's side of pre-flight: run the checks (heartbeating meanwhile, so the control plane
sees the node alive), record and report the result, and wait for the attempt's decision.

A node that failed ends at once (`preflight.failed`, naming itself, the result as evidence). A
node that passed asks `GET .../preflight` until every node of the attempt passed (start its
ranks) or one failed (start nothing: its outcome is a stop, so the failed node's reason is the
attempt's). Without a control plane the node decides alone; a decision that never comes
(`peer_wait_s`) starts the ranks anyway: a peer that is gone is the control plane's `node.lost`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from aerie_contracts.container import write_json
from aerie_contracts.failures import FailureKind, reason
from aerie_contracts.health import PreflightSettings
from aerie_contracts.preflight import PHASE_PREFLIGHT, Decision, PreflightResult, failed_checks, summary_line
from aerie_contracts.sagemaker_api import PHASE, PHASE_SINCE
from agent.preflight import Node, run_checks

log = logging.getLogger("aerie.agent")

RESULT_FILE = "preflight.json"  # <node dir>/preflight.json: the last result, for people and backends


class Gate:
    """One pre-flight of one worker group. `outcome` after `run()`: None (start the ranks) or the
    node's failure reason (`preflight.failed`) or stop reason (a peer failed)."""

    def __init__(
        self,
        settings: PreflightSettings,
        node: Node,
        env: Mapping[str, str],
        reporter: Any,
        node_dir: Path,
        heartbeat_s: float = 5.0,
        stop: threading.Event | None = None,
        checks: Callable[[], PreflightResult] | None = None,
    ):
        self.settings, self.node, self.env, self.reporter = settings, node, env, reporter
        self.node_dir, self.heartbeat_s = node_dir, heartbeat_s
        self.stop = stop or threading.Event()
        self._checks = checks or (lambda: run_checks(settings, node, env))
        self.result: PreflightResult | None = None
        self.outcome: dict[str, Any] | None = None

    def run(self) -> bool:
        """True: start the ranks."""
        since = time.time()
        self.result = self._measure(since)
        if self.result is None:
            return False  # a stop request
        res = self.result
        write_json(self.node_dir / RESULT_FILE, {**res, "attempt": self.node.attempt})
        log.info("pre-flight on %s %s", self.node.host, summary_line(res))
        answer = self.reporter.preflight(res) if self.reporter.enabled else None
        if not res.get("passed"):
            bad = ", ".join(str(c.get("check")) for c in failed_checks(res))
            self.outcome = reason(
                FailureKind.PREFLIGHT_FAILED,
                f"pre-flight failed on {self.node.host} ({bad}): {summary_line(res)}",
                host=self.node.host,
                at=res.get("t", time.time()),
                evidence={"preflight": res},
            )
            return False
        if not self.reporter.enabled:
            return True
        return self._await_peers(answer, since)

    def _measure(self, since: float) -> PreflightResult | None:
        box: dict[str, PreflightResult] = {}
        worker = threading.Thread(target=lambda: box.update(r=self._checks()), name="preflight", daemon=True)
        worker.start()
        while worker.is_alive():
            self._beat(since)
            worker.join(self.heartbeat_s)
            if self.stop.is_set():
                return None
        return box.get("r")

    def _await_peers(self, answer: Any, since: float) -> bool:
        deadline = time.time() + self.settings.peer_wait_s
        next_beat = 0.0
        while not self.stop.is_set():
            action = (answer or {}).get("action") if isinstance(answer, dict) else None
            if action == Decision.START:
                return True
            if action == Decision.ABORT or self.reporter.attempt_over:
                why = (answer or {}).get("why") or "the attempt ended"
                log.warning("pre-flight: %s starts no ranks (%s)", self.node.host, why)
                self.outcome = reason(FailureKind.USER_STOP, f"ranks not started: {why}", host=self.node.host)
                return False
            if time.time() > deadline:
                log.warning(
                    "pre-flight: no decision for %s after %.0fs: starting", self.node.host, self.settings.peer_wait_s
                )
                return True
            if time.time() >= next_beat:
                self._beat(since)
                next_beat = time.time() + self.heartbeat_s
            self.stop.wait(0.5)
            answer = self.reporter.preflight_decision()
        return False

    def _beat(self, since: float) -> None:
        if self.reporter.enabled:
            self.reporter.heartbeat(
                {"t": time.time(), "host": self.node.host, PHASE: PHASE_PREFLIGHT, PHASE_SINCE: since}
            )
