"""The in-place hand-over: where the backend keeps agents up between attempts
(`AERIE_IN_PLACE_WAIT_S`), a failed worker group does not end the agent. It stops its ranks once
the control plane says the attempt is over (the heartbeat's answer), asks what comes next
(`GET .../next`), and for an in-place successor restarts only its worker group with the new
attempt's id, token and resume point (a warm attempt: agent.warm started its ranks already).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from typing import Any

from aerie_contracts import env as E
from aerie_contracts.container import write_json
from aerie_contracts.restarts import LEFT_OUT, NextAction
from agent.identity import master_address
from agent.node_state import TERM_GRACE_S, VERDICT_GRACE_S, NodeState
from agent.progress_sources import make_monitor

log = logging.getLogger("aerie.agent")


class InPlaceHandover(NodeState):
    """Between two worker groups: the successor warmed, awaited and switched to."""

    @property
    def warm_wait_s(self) -> float:
        """How long the agent waits for an in-place successor after a failed worker group."""
        try:
            return max(0.0, float(E.IN_PLACE_WAIT_S.get() or 0))
        except ValueError:
            return 0.0

    def _prewarm(self) -> None:
        """Start the successor's ranks now (agent.warm), while this group is torn down and the
        control plane decides: an in-place restart then skips the interpreters' start-up."""
        if self.warm_wait_s > 0 and not self.stop_requested and self.warm.proc is None:
            self.warm.start(self._group_env())
            log.info("node %s: the next worker group warms up (%s)", self.cfg.host, self.warm.state())

    def _attempt_ended(self) -> None:
        """The heartbeat's answer said stop: the attempt failed elsewhere (these ranks' work is
        void: the verdict's short grace) or the job is stopping (a stop's grace, time to finish an
        in-flight save). `GET .../next` tells the two apart; the agent stays up either way."""
        self.attempt_over = True
        answer = self.reporter.next_attempt() or {}
        failed = answer.get("action") in (NextAction.WAIT, NextAction.RESTART)
        log.info(
            "attempt %s is over (%s): stopping the ranks of %s", self.cfg.attempt, answer.get("why"), self.cfg.host
        )
        self._terminate_ranks(VERDICT_GRACE_S if failed else TERM_GRACE_S)
        if failed:
            self._prewarm()

    def _await_in_place(
        self, poll_s: float = 0.5, fast_s: float = 0.1, fast_for_s: float = 5.0
    ) -> dict[str, Any] | None:
        """The in-place successor attempt (`GET .../next` said restart), or None: the agent ends
        (a relaunch or the job's end was decided, a stop request, or no word within the wait)."""
        wait_s = self.warm_wait_s
        if wait_s <= 0 or self.stop_requested or not self.reporter.enabled:
            return None
        deadline = time.time() + wait_s
        log.info("node %s waits up to %.0fs for an in-place restart", self.cfg.host, wait_s)
        while time.time() < deadline and not self.stop_requested:
            answer = self.reporter.next_attempt()
            action = (answer or {}).get("action")
            if action == NextAction.RESTART:
                return answer
            if action == NextAction.EXIT:
                self.warm.discard()
                self._job_over = str((answer or {}).get("why", "")).startswith("job ")
                self._left_out = LEFT_OUT in str((answer or {}).get("why", ""))  # a spare took its slot
                log.info("node %s: no in-place restart (%s)", self.cfg.host, (answer or {}).get("why"))
                return None
            # Asked often while the decision is due (the verdict is seconds old), then at `poll_s`.
            waited = time.time() - (deadline - wait_s)
            self._stop.wait(fast_s if waited < fast_for_s else poll_s)  # wakes at once on SIGTERM
        return None

    def _switch(self, successor: dict[str, Any]) -> None:
        """Serve the in-place attempt `successor`: its id, token and resume point for the agent and
        the ranks it starts next (with a memory resume point, its durable fallback and who holds
        which snapshot); per-group state and files of the attempt before set aside."""
        cfg = self.cfg
        attempt, token = str(successor["attempt_id"]), str(successor["token"])
        previous = os.environ.get(E.ATTEMPT_NUMBER, "")
        os.environ.update(
            {
                E.ATTEMPT: attempt,
                E.AGENT_TOKEN: token,
                E.ATTEMPT_NUMBER: str(successor.get("attempt_number") or ""),
                E.RESUME_FROM: successor.get("resume_from") or "",
                E.RESUME_FALLBACK: successor.get("resume_fallback") or "",
                E.MEMORY_RESUME_NODES: json.dumps(successor["memory_nodes"]) if successor.get("memory_nodes") else "",
            }
        )
        if successor.get("memckpt_key"):
            os.environ[E.MEMORY_CHECKPOINT_KEY] = str(successor["memckpt_key"])  # the memory tier's, next group
        self.cfg = dataclasses.replace(cfg, attempt=attempt, token=token)
        port = successor.get("master_port")
        if isinstance(port, int) and not isinstance(port, bool) and 0 < port < 65536:
            ident = None if cfg.identity is None else dataclasses.replace(cfg.identity, master_port=port)
            self.cfg = dataclasses.replace(self.cfg, master_port=port, identity=ident)
            os.environ[E.MASTER_PORT] = str(port)
        addr = successor.get("master_addr")
        if isinstance(addr, str) and addr and addr != self.cfg.master_addr:  # a spare holds rank 0's slot now
            ident = self.cfg.identity
            ident = None if ident is None else dataclasses.replace(ident, master_addr=addr)
            self.cfg = dataclasses.replace(self.cfg, master_addr=addr, identity=ident)
            os.environ[E.MASTER_ADDR] = addr
        self.reporter.retarget(attempt, token)
        hosts = successor.get("hosts")
        if isinstance(hosts, list) and cfg.host in hosts and tuple(hosts) != self.cfg.hosts:
            peers = successor.get("memory_peers")
            self._take_hosts([str(h) for h in hosts], peers if isinstance(peers, dict) else None)
        stale_files = [cfg.node_dir / "exit.json", cfg.ml_root / "output" / "failure"]
        for stale in [*stale_files, *(cfg.node_dir / "ranks").glob("rank-*")]:
            stale.unlink(missing_ok=True)  # the last group's outcome must not be read as this one's
        if cfg.metrics_dir.exists():
            # A fresh stream: the monitor and the control plane must not re-read the last group's steps.
            cfg.metrics_dir.rename(cfg.metrics_dir.with_name(f"{cfg.metrics_dir.name}.attempt-{previous or 'prev'}"))
        cfg.metrics_dir.mkdir(parents=True, exist_ok=True)
        self.proc, self.verdict, self.attempt_over = None, None, False
        self._term_sent_at, self._grace_s = None, TERM_GRACE_S
        self.restore_s = self.restore_failure = self.restored_step = None
        self.snapshot_s = {}
        self._metrics_batch = []
        if self._own_monitor:
            self.monitor = make_monitor(self.cfg)
        log.info("node %s restarts its worker group in place for %s", cfg.host, attempt)

    def _take_hosts(self, hosts: list[str], peers: dict[str, str] | None = None) -> None:
        """The attempt's nodes changed (a hot spare took a failed node's slot): this node's
        identity, its resourceconfig.json (the ranks' SM_HOSTS), its memory ring and its next
        worker group follow."""
        cfg = self.cfg
        ident = cfg.identity
        if ident is not None:
            groups = ident.instance_groups
            if len(groups) == 1:
                groups = ({**groups[0], "hosts": list(hosts)},)
            ident = dataclasses.replace(ident, hosts=tuple(hosts), instance_groups=groups)
            write_json(cfg.ml_root / "input" / "config" / "resourceconfig.json", ident.resource_config())
        # The rendezvous host is the first of the attempt's (unless AERIE_MASTER_ADDR names one).
        master = master_address(os.environ, tuple(hosts))
        ident = ident if ident is None else dataclasses.replace(ident, master_addr=master)
        self.cfg = dataclasses.replace(cfg, hosts=tuple(hosts), identity=ident, master_addr=master)
        if self.memory is not None:
            self.memory.retarget(list(hosts), peers)
        # A warm group takes its place from the go file (`agent.warm.regrouped`): a spare's, warm
        # since it began to wait, becomes this slot's ranks.
        self.warm.node_rank, self.warm.nnodes = self.cfg.node_rank, len(hosts)
        # Every node of an in-place attempt starts its ranks the same way (warm groups, no torchrun
        # rendezvous): one not warm yet starts warming now.
        self._prewarm()
        log.info("node %s: the attempt's nodes are now %s (rank %d)", cfg.host, ", ".join(hosts), self.cfg.node_rank)
