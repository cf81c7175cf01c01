"""A hot spare (`AERIE_SPARE`, `resources.spare_nodes`) starts no worker group at first: it takes
its inputs, starts its memory tier, runs the node-local part of pre-flight, warms its ranks, and
then asks the control plane until an in-place attempt gives it a failed node's rank slot (the
answer's host list), or the job ends.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from aerie_contracts import env as E
from aerie_contracts.container import write_json
from aerie_contracts.restarts import NextAction
from agent.identity import spare_hosts
from agent.node_state import NodeState

log = logging.getLogger("aerie.agent")


class HotSpare(NodeState):
    """Whether this node is a spare, and its wait for a slot."""

    @property
    def spare(self) -> bool:
        return E.SPARE.get() == "1" or self.cfg.host in spare_hosts()

    def _await_slot(self, poll_s: float = 0.5) -> dict[str, Any] | None:
        """A spare's wait: pre-flight (node-local checks), then `GET .../next` until an in-place
        attempt hands this node a rank slot; None: the job ended, a relaunch (with spares of its
        own) left this one out, a stop request, or this node failed its pre-flight."""
        if not self._spare_preflight():
            return None
        self._prewarm()  # its ranks import torch now, not on the recovery path
        log.info("node %s is a hot spare: it waits for a failed node's slot", self.cfg.host)
        while not self.stop_requested:
            answer = self.reporter.next_attempt() if self.reporter.enabled else None
            action = (answer or {}).get("action")
            if action == NextAction.RESTART:
                log.info("hot spare %s takes a rank slot in %s", self.cfg.host, (answer or {}).get("attempt_id"))
                return answer
            if action == NextAction.EXIT:
                self._job_over = str((answer or {}).get("why", "")).startswith("job ")
                log.info("hot spare %s not needed: %s", self.cfg.host, (answer or {}).get("why"))
                return None
            self._stop.wait(poll_s)  # wakes at once on SIGTERM
        return None

    def _spare_preflight(self) -> bool:
        """`health.preflight`'s checks on this node alone (its collective is a one-node one, on a
        port of its own): the attempt's nodes check their links when a spare joins them in place
        (`health.preflight.in_place`). The result goes to agent/preflight.json and the node's log;
        False: the spare fails them and never takes a slot."""
        import socket

        from aerie_contracts.preflight import summary_line
        from agent.preflight import Node, run_checks
        from agent.preflight.node import RESULT_FILE

        cfg = self.cfg
        settings = cfg.health.preflight
        if not settings.enabled:
            return True
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        node = Node(cfg.host, (cfg.host,), "127.0.0.1", port, cfg.attempt, cfg.procs_per_node)
        result = run_checks(settings, node, dict(os.environ))
        write_json(cfg.node_dir / RESULT_FILE, {**result, "attempt": cfg.attempt, "spare": True})
        log.info("pre-flight on hot spare %s %s", cfg.host, summary_line(result))
        if self.reporter.enabled:  # for the API and `aerie describe` (no attempt node: no verdict)
            self.reporter.preflight({**result, "spare": True})
        return bool(result.get("passed"))
