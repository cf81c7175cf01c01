"""What a worker group needs before any rank starts: the input channels (agent/channels.py, once
per node), the pre-flight checks (`health.preflight`, agent/preflight/, each group) and a
third-party trainer's resume checkpoint (agent/byo_checkpoints.py). Each step returns False when
the node must end now; the reason is kept for agent/outcome.py.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from aerie_contracts import env as E
from aerie_contracts.container import PHASE_DATA_DOWNLOAD
from aerie_contracts.failures import FailureKind
from agent.node_state import NodeState

log = logging.getLogger("aerie.agent")


class NodeInputs(NodeState):
    """Channels, pre-flight and the resume checkpoint, in that order."""

    def _receive_inputs(self) -> bool:
        """File-mode channels downloaded, FastFile ones checked, before any rank starts
        (agent.channels). False: the node ends now (input.unavailable, or a stop request)."""
        from aerie_s3.ranged import Cancelled
        from agent import channels

        cfg = self.cfg

        def notify(progress: dict[str, Any]) -> None:
            beat = {"t": time.time(), "host": cfg.host, "phase": PHASE_DATA_DOWNLOAD}
            self.reporter.heartbeat(beat)  # the control plane sees the node alive while it downloads

        try:
            record = channels.receive(cfg.ml_root, os.environ, cfg.hosts, cfg.host, stop=self._stop, notify=notify)
        except channels.InputUnavailable as exc:
            log.error("%s", exc)
            self.input_failure = exc.reason(cfg.host)
            return False
        except Cancelled:
            return False  # a stop request: the outcome is user.stop
        channels.write_record(cfg.node_dir, record)
        if self.monitor is not None and hasattr(self.monitor, "started_at"):
            self.monitor.started_at = time.time()  # startup grace and first-step timeout start with the ranks
        return True

    def _preflight(self) -> bool:
        """The spec's pre-flight checks (`health.preflight`, agent/preflight/) before this group's
        ranks start: False when this node failed them or a peer did (no rank starts)."""
        from agent.preflight import Node
        from agent.preflight.node import Gate

        cfg = self.cfg
        settings = cfg.health.preflight
        self.preflight_outcome = None
        if not settings.enabled or (self.groups > 1 and not settings.in_place):
            return True
        node = Node(
            cfg.host,
            tuple(cfg.hosts),
            cfg.master_addr,
            cfg.master_port,
            cfg.attempt,
            cfg.procs_per_node,
            cfg.interfaces[0] if cfg.interfaces else "",
        )
        gate = Gate(
            settings,
            node,
            dict(os.environ),
            self.reporter,
            cfg.node_dir,
            heartbeat_s=cfg.health.heartbeat_s,
            stop=self._stop,
        )
        go = gate.run()
        self.preflight_outcome = gate.outcome  # the result itself: agent/preflight.json and the control plane
        if go and self.monitor is not None and hasattr(self.monitor, "started_at"):
            self.monitor.started_at = time.time()  # startup grace and first-step timeout start with the ranks
        return go

    def _restore_checkpoint(self) -> bool:
        """A third-party trainer's checkpoints (`checkpoint.marker`): watch its directory (uploads
        from rank 0's node), and on a resume put the checkpoint back there, verified, before any
        rank starts. On an in-place restart the last group's files are set aside first, and the
        resume point stays where it is if this node committed it (`byo_checkpoints.hand_over`).
        False: the node ends now (`checkpoint.failed`)."""
        from agent.byo_checkpoints import CheckpointSync, hand_over

        cfg = self.cfg
        previous = self.checkpoints
        self.checkpoints = CheckpointSync.from_env(dict(os.environ), cfg.ml_root, uploads=cfg.node_rank == 0)
        if self.checkpoints is None:
            return True
        self.checkpoints.root.mkdir(parents=True, exist_ok=True)
        resume = E.RESUME_FROM.get()
        t0 = time.time()
        if previous is not None:  # in place: the same node, the last worker group's files still here
            tag = f"attempt-{previous.attempt if previous.attempt is not None else 'prev'}"
            try:
                kept = hand_over(previous, self.checkpoints, resume, tag)
            except OSError as exc:
                return self._checkpoint_failed(resume or str(self.checkpoints.root), f"cannot set aside: {exc}")
            if kept is not None:
                self.restore_s = time.time() - t0
                log.info("resuming from %s, kept in place in %s", resume, self.checkpoints.root / kept)
                return True
        if not resume:
            return True
        try:
            where = self.checkpoints.restore(resume)
        except Exception as exc:
            if self.checkpoints.gate is not None and cfg.node_rank == 0:
                self.checkpoints.gate.mark_bad(resume, f"restore failed: {exc}")
            return self._checkpoint_failed(resume, f"restore of {resume} failed: {exc}")
        self.restore_s = time.time() - t0
        log.info("restored %s into %s in %.1fs", resume, where, self.restore_s)
        return True

    def _checkpoint_failed(self, what: str, message: str) -> bool:
        log.error("%s (%s)", message, what)
        self.restore_failure = {"kind": FailureKind.CHECKPOINT_FAILED, "message": message, "host": self.cfg.host}
        return False
