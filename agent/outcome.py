"""A worker group's outcome: the last checkpoints up after a clean exit, the model uploaded (the
first host, as SageMaker would), and the node's exit code and reason, decided in one order
(inputs, pre-flight, restore, verdict, stop, a failed rank, the launcher) and written where the
backends and SageMaker look (agent/exit.json, output/failure) and sent to the control plane.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from aerie_contracts import env as E
from aerie_contracts.container import read_json, write_json
from aerie_contracts.failures import STOPPED_ON_REQUEST, FailureKind
from agent.config import write_failure
from agent.node_state import NodeState

log = logging.getLogger("aerie.agent")


class NodeOutcome(NodeState):
    """Exit code and reason of the node, after each worker group."""

    def _finish(self, returncode: int) -> int:
        code, reason = self._outcome(returncode)
        if code == 0:
            reason = self._upload_model()
            code = 1 if reason else 0
        outcome = {"exit_code": code, "reason": reason, "t": time.time(), "host": self.cfg.host}
        # The attempt it belongs to: the backend's poll of an in-place successor skips it.
        write_json(self.cfg.node_dir / "exit.json", {**outcome, "attempt": self.cfg.attempt})
        if code != 0 and reason:
            write_failure(self.cfg.ml_root, reason)
        self.reporter.exit(outcome)
        log.info("node %s finished: exit %s %s", self.cfg.host, code, reason or "")
        return code

    def _upload_model(self) -> dict[str, Any] | None:
        """After a clean run, the first host uploads model/ as SageMaker would (agent/artifacts.py),
        telling the control plane first (heartbeat `phase: uploading`). The failure reason, or None."""
        from aerie_contracts import sagemaker_api as contract
        from aerie_contracts.failures import FailureKind, reason
        from agent import artifacts

        uri = E.MODEL_ARTIFACTS_URI.get()
        if not uri or self.cfg.host != self.cfg.hosts[0]:
            return None
        # Kept in every later summary too: the last one the control plane stores must still say it.
        self.phase = {contract.PHASE: contract.PHASE_UPLOADING, contract.PHASE_SINCE: time.time()}
        self.reporter.heartbeat_now(self._summary())
        try:
            size = artifacts.upload_model(self.cfg.ml_root / "model", uri)
        except Exception as exc:
            log.error("model upload to %s failed: %s", uri, exc)
            return reason(FailureKind.UPLOAD_FAILED, f"model upload to {uri} failed: {exc}", host=self.cfg.host)
        log.info("uploaded the model (%d bytes) to %s", size, uri)
        return None

    def _outcome(self, returncode: int) -> tuple[int, dict[str, Any] | None]:
        if self.input_failure is not None:
            return 2, self.input_failure
        if self.preflight_outcome is not None:
            # This node failed its pre-flight (retried without it), or a peer did (a stop: not its failure).
            stopped = self.preflight_outcome.get("kind") == FailureKind.USER_STOP
            return (143 if stopped else 1), self.preflight_outcome
        if self.restore_failure is not None:
            return 1, self.restore_failure  # retried: chaining falls back to an older good checkpoint
        if self.verdict is not None:
            v = self.verdict
            return 1, {"kind": v["kind"], "message": v["message"], "host": self.cfg.host, "at": v["t"]}
        if self.stop_requested:
            return 143, {"kind": FailureKind.USER_STOP, "message": STOPPED_ON_REQUEST, "host": self.cfg.host}
        failed = self._first_failed_rank()
        if failed is not None:
            return failed["exit_code"] or 1, {
                "kind": FailureKind.EXIT_NONZERO,
                "host": self.cfg.host,
                "rank": failed["rank"],
                "exit_code": failed["exit_code"],
                "signal": failed.get("signal"),
                "at": failed.get("t"),
                "message": f"rank {failed['rank']} exited with code {failed['exit_code']}"
                + (f" (signal {failed['signal']})" if failed.get("signal") else ""),
            }
        if returncode != 0:
            code = 128 - returncode if returncode < 0 else returncode
            return code, {
                "kind": FailureKind.EXIT_NONZERO,
                "host": self.cfg.host,
                "exit_code": code,
                "message": f"launcher exited with code {code}",
            }
        return 0, None

    def _first_failed_rank(self) -> dict[str, Any] | None:
        exits = [read_json(p) for p in (self.cfg.node_dir / "ranks").glob("rank-*.exit.json")]
        failed = [e for e in exits if isinstance(e, dict) and e.get("exit_code")]
        # Ranks torchrun stopped because a peer failed end with SIGTERM later; the first one is the cause.
        return min(failed, key=lambda e: e.get("t", 0.0)) if failed else None

    def _drain_checkpoints(self, budget_s: float = 120.0) -> None:
        """After a clean exit: the last checkpoints the trainer wrote still go up before the node ends."""
        from agent.byo_checkpoints import finished_candidates

        sync = self.checkpoints
        if sync is None or not sync.uploads:
            return
        deadline = time.time() + budget_s
        while time.time() < deadline:
            sync.wait(max(0.0, deadline - time.time()))
            sync.tick(time.time())
            found = finished_candidates(sync.root, sync.marker)
            pending = [n for n in found if n not in sync.done and n not in sync.failed]
            if not pending and not sync.busy():
                return
            time.sleep(0.2)
