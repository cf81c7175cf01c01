"""Run the node's ranks, watch them, and end them fast when something is silently wrong.

One supervisor per node. It starts the entrypoint (through torchrun when the job has more than
one rank), ticks the monitor every `sample_s`, sends heartbeats every `heartbeat_s`, and on a
verdict posts it and stops the ranks' process tree (SIGTERM, grace, SIGKILL), so the attempt
fails in seconds with a named cause instead of waiting out a collective timeout. With
`health.preflight` on, every worker group first passes the node's pre-flight checks and waits for
its peers' (agent/preflight/): a node that fails starts no rank. The agent is a
child subreaper, so no rank of the tree outlives the node (see `agent.proctree.become_subreaper`).

Where the backend keeps agents up between attempts (`AERIE_IN_PLACE_WAIT_S`), a failed worker
group does not end the agent: it stops its ranks once the control plane says the attempt is over
(the heartbeat's answer), asks what comes next (`GET .../next`), and for an in-place successor
restarts only its worker group with the new attempt's id, token and resume point (a warm attempt).
A hot spare (`AERIE_SPARE`, `resources.spare_nodes`) starts no worker group at all: it takes its
inputs, starts its memory tier, runs the node-local part of pre-flight, and then asks the control
plane until an in-place attempt gives it a failed node's rank slot (the answer's host list), or
the job ends.

Over 400 lines on purpose: the node's lifecycle (launch, tick, heartbeat, stop, the in-place
hand-over, outcome) is one state machine over shared state; what stands apart lives beside it
(agent.config, agent.progress_sources, agent.proctree).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import signal
import statistics
import subprocess
import threading
import time
from typing import Any

import psutil

from aerie_contracts import byo
from aerie_contracts import env as E
from aerie_contracts import metrics as metric_keys
from aerie_contracts.failures import STOPPED_ON_REQUEST, FailureKind
from aerie_contracts.goodput import SUMMARY_RESTORE_S, SUMMARY_RESTORED_STEP, SUMMARY_SNAPSHOT_S
from aerie_contracts.metrics import MetricEvent
from aerie_contracts.restarts import LEFT_OUT, NextAction
from agent.config import AgentConfig, rank_command, write_failure
from agent.contract import PHASE_DATA_DOWNLOAD, read_json, trainer_env, write_json
from agent.identity import master_address, spare_hosts
from agent.proctree import become_subreaper, kill_tree, killpg
from agent.progress_sources import make_monitor, make_tb_progress
from agent.warm import WarmGroup

log = logging.getLogger("aerie.agent")

TERM_GRACE_S = 10.0  # after a stop request: time to finish the step and an in-flight save
VERDICT_GRACE_S = 1.0  # after a verdict: the ranks are hung or diverged, nothing to save; a restart waits on it
STALL_ASK_S = 0.5  # how often a node whose ranks stalled asks whether the attempt is over (Supervisor._stalled)
WATCH_S = 0.1  # how often the watch loop looks for a dead rank (and how soon it sees the group end: at once)
JOB_END_WAIT_S = 5.0  # at exit: how long a node waits for the control plane to say whether the job ended
# Rank 0's training steps forwarded to the control plane (POST .../metrics), batched.
METRIC_KEYS = ("t", "step", "loss", "grad_norm", "lr", "tokens_per_s", "mfu", "tokens_per_dollar")
METRICS_EVERY_S = 2.0
METRICS_BATCH = 500
SNAPSHOTS_KEPT = 16  # the memory tier's recent snapshot stalls the heartbeat's median is taken over


class Supervisor:
    def __init__(self, cfg: AgentConfig, monitor: Any = None, reporter: Any = None):
        from agent.report import Reporter

        self.cfg = cfg
        self._own_monitor = monitor is None  # remade for each worker group
        self.monitor = monitor if monitor is not None else make_monitor(cfg)
        self.reporter = reporter or Reporter(cfg.api, cfg.token, cfg.attempt, cfg.host)
        self.proc: subprocess.Popen | None = None
        self.verdict: dict[str, Any] | None = None
        self.stop_requested = False
        self._term_sent_at: float | None = None
        self._grace_s = TERM_GRACE_S
        self._reported_checkpoints: set[str] = set()
        self._metrics_batch: list[dict[str, Any]] = []
        self._metrics_sent_at = 0.0
        self._stop = threading.Event()  # set with stop_requested: ends a channel download
        self.phase: dict[str, Any] = {}  # a phase after training (the model upload) that every later summary says
        self.restore_s: float | None = None  # the slowest of this node's ranks' checkpoint restores
        self.restored_step: int | None = None  # the lowest step its ranks restored (a fallback resumes earlier)
        self.snapshot_s: dict[int, float] = {}  # step → its slowest rank's in-memory snapshot stall (recent)
        self.input_failure: dict[str, Any] | None = None
        self.restore_failure: dict[str, Any] | None = None
        self.checkpoints: Any = None  # agent.byo_checkpoints.CheckpointSync for a third-party trainer
        self.tb_progress: Any = None  # agent.tb_progress.TensorBoardProgress: progress from event files
        self.attempt_over = False  # the control plane said this attempt ended (elsewhere, maybe)
        self.memory: Any = None  # agent.memckpt.node.NodeMemoryTier, when the backend turned it on
        # The next worker group's ranks, warm (torch imported) before this one can fail: agent.warm.
        self.warm = WarmGroup(
            cfg.node_dir,
            cfg.workdir,
            cfg.entrypoint,
            procs=cfg.procs_per_node,
            node_rank=cfg.node_rank,
            nnodes=len(cfg.hosts),
        )
        self._job_over = False  # the control plane said the job ended (its memory area can go)
        self._left_out = False  # the in-place successor goes on without this node: it exits 0
        self.groups = 0  # worker groups started by this agent (the second and later are in place)
        self.preflight_outcome: dict[str, Any] | None = None  # why this group's ranks never started

    # --- lifecycle ------------------------------------------------------------------------

    def run(self) -> int:
        cfg = self.cfg
        cfg.node_dir.mkdir(parents=True, exist_ok=True)
        (cfg.node_dir / "ranks").mkdir(exist_ok=True)
        cfg.metrics_dir.mkdir(parents=True, exist_ok=True)
        write_json(cfg.node_dir / "agent.pid", os.getpid())
        signal.signal(signal.SIGTERM, self._on_stop_signal)
        signal.signal(signal.SIGINT, self._on_stop_signal)
        become_subreaper()
        if not self._receive_inputs():
            return self._finish(1)
        self._start_memory_tier()
        code = 1
        try:
            if self.spare:
                slot = self._await_slot()
                if slot is None:
                    code = 0  # never needed: not a failure of anything
                    return code
                self._switch(slot)
            while True:
                code = self._run_group()
                if code != 0 and self.preflight_outcome is None:
                    self._prewarm()
                successor = self._await_in_place() if code != 0 else None
                if successor is None:
                    return 0 if self._left_out else code
                self._switch(successor)
        finally:
            self.warm.discard()
            if self.memory is not None:
                self.memory.close(job_over=code == 0 or self._job_ended())

    def _job_ended(self, wait_s: float = JOB_END_WAIT_S, poll_s: float = 0.5) -> bool:
        """Whether the job is over (its memory area can go), as the control plane says: a stop
        request is also how a relaunch tears this node down, and the next attempt may restore
        from what this node holds. While the control plane has not decided yet (the last attempt
        failed a moment ago), asked again for up to `wait_s`: a failed job's area must not stay
        in /dev/shm (what is left anyway, lease.sweep takes later)."""
        deadline = time.time() + wait_s
        while not self._job_over and self.reporter.enabled:
            answer = self.reporter.next_attempt()
            if answer is None:
                break  # unreachable: the sweep will do
            action, why = answer.get("action"), str(answer.get("why", ""))
            self._job_over = action == NextAction.EXIT and why.startswith("job ")
            if action != NextAction.WAIT or time.time() >= deadline:
                break
            time.sleep(poll_s)
        return self._job_over

    def _start_memory_tier(self) -> None:
        from agent.memckpt.node import start_tier
        from agent.memckpt.platform import sagemaker_env

        # On SageMaker the node derives its area and the ring (every instance, spares too); the
        # ranks read the area from the same environment.
        ident = self.cfg.identity
        everyone = [*self.cfg.hosts, *spare_hosts(), *(ident.all_hosts if ident is not None else ())]
        os.environ.update(sagemaker_env(os.environ, host=self.cfg.host, everyone=everyone))
        self.memory = start_tier(os.environ, host=self.cfg.host, hosts=list(self.cfg.hosts))

    def _begin_memory_group(self) -> None:
        if self.memory is not None:
            cfg = self.cfg
            self.memory.begin_from_env(self.reporter, os.environ, node_rank=cfg.node_rank, procs=cfg.procs_per_node)

    def _run_group(self) -> int:
        """One attempt's worker group on this node, from restore to outcome (the node's exit code)."""
        cfg = self.cfg
        self.groups += 1
        if not self._preflight():
            return self._finish(1)
        if not self._restore_checkpoint():
            return self._finish(1)
        self.tb_progress = make_tb_progress(cfg)
        if self.tb_progress is not None:
            # transformers.Trainer writes its TensorBoard events where TENSORBOARD_LOGGING_DIR names.
            self.tb_progress.directory.mkdir(parents=True, exist_ok=True)
        env = self._group_env()
        cmd = rank_command(cfg)
        self._begin_memory_group()
        warm = self.warm.take(
            env, cfg.master_addr, cfg.master_port, tick=lambda: self.reporter.heartbeat(self._summary())
        )
        log.info(
            "starting %d rank(s) on %s%s: %s",
            cfg.procs_per_node,
            cfg.host,
            " (warm: torch already imported)" if warm else "",
            " ".join(cfg.entrypoint),
        )
        # Own session: the whole rank tree can be signalled at once, and only it.
        self.proc = warm or subprocess.Popen(
            cmd, cwd=str(cfg.workdir), env=_cold_env(env, cfg), start_new_session=True, stdin=subprocess.DEVNULL
        )
        write_json(cfg.node_dir / "trainer.pgid", self.proc.pid)
        self._watch_group()
        return self._finish(self.proc.returncode)

    def _group_env(self) -> dict[str, str]:
        """The ranks' environment (torchrun's per-rank variables aside)."""
        cfg = self.cfg
        env = dict(os.environ)
        # SageMaker sets no SM_* at all: the agent does, as its training toolkit would, and points
        # the ranks at the agent's own directory (pid and exit files) and the metrics stream.
        env.update(trainer_env(cfg.node_identity, env))
        env.update({E.NODE_DIR: str(cfg.node_dir), E.METRICS_PATH: str(cfg.metrics_dir)})
        if self.checkpoints is not None:
            env[E.CHECKPOINT_DIR] = str(self.checkpoints.root)
        if self.tb_progress is not None:
            env.setdefault("TENSORBOARD_LOGGING_DIR", str(self.tb_progress.directory))
        env.setdefault("OMP_NUM_THREADS", "1")  # what torchrun would pick, without its banner
        env.pop(E.MEMORY_CHECKPOINT_KEY, None)  # the agents' secret: the ranks (user code) never need it
        return env

    def _watch_group(self) -> None:
        """Tick, beat and escalate until the worker group ends; then its last lines and leftovers."""
        assert self.proc is not None
        cfg = self.cfg
        sample_s, heartbeat_s = cfg.health.sample_s, cfg.health.heartbeat_s
        next_beat = next_tick = next_stall_check = 0.0
        while self.proc.poll() is None:
            now = time.time()
            if now >= next_tick:
                self._tick(now)
                if self.warm_wait_s > 0 and self.reporter.attempt_over and not self.attempt_over:
                    self._attempt_ended()
                next_tick = now + (min(sample_s, 0.5) if self._term_sent_at else sample_s)
            if now >= next_stall_check:
                next_stall_check = now + STALL_ASK_S
                if self._stalled(now) and ((self.reporter.next_attempt() or {}).get("attempt_over")):
                    self._attempt_ended()  # a failure elsewhere ended the attempt: stop now, not at the next beat
            if now >= next_beat:
                summary = self._summary()
                self.reporter.heartbeat(summary)
                next_beat = now + heartbeat_s
                if summary.get("last_step") is not None:
                    self._prewarm()  # the group trains: its successor may warm up now
            self._kill_on_dead_rank()
            self._escalate(now)
            try:  # wakes at once when the group ends; a rank's death is looked for every WATCH_S
                self.proc.wait(timeout=WATCH_S)
            except subprocess.TimeoutExpired:
                pass
        if self.memory is not None:
            # A failed group's newest snapshot is replicated and reported before this node's
            # failure report: it may be what the restart resumes from.
            self.memory.end_group(flush=self.proc.returncode != 0 and not self.stop_requested)
        self._tick(time.time(), detect=False)  # pick up the last metrics lines (checkpoints)
        if self.proc.returncode == 0 and self.verdict is None and not self.stop_requested:
            self._drain_checkpoints()
        leftovers = kill_tree(self.proc.pid, spare=self.warm.pid)  # what torchrun left behind, if anything
        psutil.wait_procs(leftovers, timeout=5)  # adopted by this subreaper: reap them

    # --- in place -------------------------------------------------------------------------

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

    # --- a hot spare ---------------------------------------------------------------------------

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

    def _on_stop_signal(self, signum, _frame) -> None:
        self.stop_requested = True
        self._stop.set()
        self._terminate_ranks()

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
        rank starts. False: the node ends now (`checkpoint.failed`)."""
        from agent.byo_checkpoints import CheckpointSync

        cfg = self.cfg
        self.checkpoints = CheckpointSync.from_env(dict(os.environ), cfg.ml_root, uploads=cfg.node_rank == 0)
        if self.checkpoints is None:
            return True
        self.checkpoints.root.mkdir(parents=True, exist_ok=True)
        resume = E.RESUME_FROM.get()
        if not resume:
            return True
        t0 = time.time()
        try:
            where = self.checkpoints.restore(resume)
        except Exception as exc:
            log.error("cannot restore %s into %s: %s", resume, self.checkpoints.root, exc)
            if self.checkpoints.gate is not None and cfg.node_rank == 0:
                self.checkpoints.gate.mark_bad(resume, f"restore failed: {exc}")
            self.restore_failure = {
                "kind": FailureKind.CHECKPOINT_FAILED,
                "message": f"restore of {resume} failed: {exc}",
                "host": cfg.host,
            }
            return False
        self.restore_s = time.time() - t0
        log.info("restored %s into %s in %.1fs", resume, where, self.restore_s)
        return True

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

    def _terminate_ranks(self, grace_s: float = TERM_GRACE_S) -> None:
        self._grace_s = min(self._grace_s, grace_s)
        if self.proc and self.proc.poll() is None and self._term_sent_at is None:
            self._term_sent_at = time.time()
            killpg(self.proc.pid, signal.SIGTERM)
            killpg(self.proc.pid, signal.SIGCONT)  # a stopped rank can only act on SIGTERM once resumed

    def _stalled(self, now: float) -> bool:
        """With in-place restarts on: this group's ranks have made no step for longer than
        max(1 s, 3 x their median step) — blocked, maybe, on a peer that died on another node. The
        agent then asks `GET .../next` every `STALL_ASK_S` whether the attempt is over (the
        heartbeat's answer may be seconds old: it is cached) and stops its ranks if so: the
        attempt's other nodes learn of a failure within about half a second of the control plane's
        decision. One small request per stalled node per half second; none while the group trains."""
        if self.warm_wait_s <= 0 or self.attempt_over or self._term_sent_at is not None or self.monitor is None:
            return False
        try:
            summary = self.monitor.summary()
        except Exception:
            return False
        last_t, p50 = summary.get("last_step_t"), summary.get("step_time_p50")
        if not isinstance(last_t, (int, float)) or not isinstance(p50, (int, float)):
            return False
        return now - float(last_t) > max(1.0, 3 * float(p50))

    def _kill_on_dead_rank(self) -> None:
        """A rank of this node died (its exit file says so) while in-place restarts are on: the
        attempt has failed whatever the others do, and their work since the last snapshot is void,
        so the whole group is killed now (SIGKILL, no grace; not left to torchrun's or the warm
        group's SIGTERM grace, nor to a collective's timeout); the node reports at once and a warm
        successor can start. Not after the agent's own SIGTERM (a stop or a verdict: its grace holds)."""
        if self._term_sent_at is not None or self.warm_wait_s <= 0 or self.proc is None:
            return
        failed = self._first_failed_rank()
        if failed is None:
            return
        self._term_sent_at, self._grace_s = time.time(), 0.0
        log.info(
            "rank %s on %s exited with code %s: its group is killed now (no grace; its work is void)",
            failed.get("rank"),
            self.cfg.host,
            failed.get("exit_code"),
        )
        kill_tree(self.proc.pid, spare=self.warm.pid)

    def _escalate(self, now: float) -> None:
        if self._term_sent_at and now - self._term_sent_at > self._grace_s and self.proc:
            kill_tree(self.proc.pid, spare=self.warm.pid)

    # --- monitoring -----------------------------------------------------------------------

    def _tick(self, now: float, detect: bool = True) -> None:
        from agent.chaos import apply_pending

        apply_pending(self.cfg.node_dir, self.cfg.interfaces)  # `aerie chaos` requests, if any
        if detect and self.warm.proc is None and self.warm_wait_s > 0 and self._first_failed_rank() is not None:
            self._prewarm()  # a rank died: the group is failing, whatever torchrun makes of it
        if self.checkpoints is not None:
            self.checkpoints.tick(now)  # uploads run in a thread of their own: training goes on
        if self.tb_progress is not None:
            self.tb_progress.poll(now, final=not detect)  # into the metrics stream the monitor reads next
        if self.monitor is None:
            return
        try:
            verdicts = self.monitor.tick(now)
        except Exception:  # a probe bug must never take the node down
            log.exception("monitor tick failed")
            return
        self._report_checkpoints()
        self._report_metrics(now, flush=not detect)
        if not detect or self.verdict is not None or self.stop_requested or not verdicts:
            return
        v = verdicts[0]
        self.verdict = {"kind": v.kind, "message": v.message, "evidence": v.evidence, "t": now, "host": self.cfg.host}
        log.error("verdict %s on %s: %s", v.kind, self.cfg.host, v.message)
        self.reporter.verdict(self.verdict)
        self._terminate_ranks(VERDICT_GRACE_S)
        self._prewarm()

    def _report_checkpoints(self) -> None:
        """Tell the control plane about committed checkpoints seen in the metrics stream."""
        sample = getattr(self.monitor, "last_sample", None) or {}
        for rec in sample.get("records", []):
            self._note_restore(rec)
            self._note_snapshot(rec)
            uri = rec.get("uri")
            if rec.get("event") == "checkpoint_committed" and uri and uri not in self._reported_checkpoints:
                self._reported_checkpoints.add(uri)
                self.reporter.checkpoint({"step": rec.get("step"), "uri": uri, "meta": rec})

    def _note_restore(self, rec: dict[str, Any]) -> None:
        if rec.get("event") != MetricEvent.RESTORED:
            return
        seconds = rec.get("restore_s")
        if isinstance(seconds, (int, float)) and not isinstance(seconds, bool) and 0 <= seconds < 1e7:
            self.restore_s = max(self.restore_s or 0.0, float(seconds))
        step = rec.get("step")
        if isinstance(step, int) and not isinstance(step, bool) and step >= 0:
            self.restored_step = step if self.restored_step is None else min(self.restored_step, step)

    def _note_snapshot(self, rec: dict[str, Any]) -> None:
        """A rank's in-memory snapshot: the step waits for the slowest rank's."""
        seconds, step = rec.get(metric_keys.SNAPSHOT_S), rec.get("step")
        if rec.get("event") != MetricEvent.CHECKPOINT_MEMORY or not isinstance(step, int):
            return
        if isinstance(seconds, (int, float)) and not isinstance(seconds, bool) and 0 <= seconds < 1e7:
            self.snapshot_s[step] = max(self.snapshot_s.get(step, 0.0), float(seconds))
            for old in sorted(self.snapshot_s)[:-SNAPSHOTS_KEPT]:
                del self.snapshot_s[old]

    def _report_metrics(self, now: float, flush: bool = False) -> None:
        """Forward global rank 0's training steps (the dashboard's durable curves), in batches of
        at most every METRICS_EVERY_S seconds or METRICS_BATCH records."""
        sample = getattr(self.monitor, "last_sample", None) or {}
        for rec in sample.get("records", []):
            if rec.get(byo.SOURCE_KEY) == byo.SOURCE_LOG and not any(rec.get(k) is not None for k in METRIC_KEYS[2:]):
                continue  # a progress bar's step, no metric: its logs line follows with the same step
            if rec.get("rank") == 0 and rec.get("event") is None and rec.get("step") is not None:
                self._metrics_batch.append({k: _json_safe(rec[k]) for k in METRIC_KEYS if k in rec})
        batch = self._metrics_batch
        if batch and (flush or len(batch) >= METRICS_BATCH or now - self._metrics_sent_at >= METRICS_EVERY_S):
            for i in range(0, len(batch), METRICS_BATCH):
                self.reporter.metrics(batch[i : i + METRICS_BATCH])
            self._metrics_batch, self._metrics_sent_at = [], now

    def _summary(self) -> dict[str, Any]:
        base: dict[str, Any] = {"t": time.time(), **self.phase}
        if self.restore_s is not None:
            base[SUMMARY_RESTORE_S] = self.restore_s  # for the goodput ledger
        if self.restored_step is not None:
            base[SUMMARY_RESTORED_STEP] = self.restored_step
        if self.snapshot_s:  # the memory tier's save stall, for the ledger and the interval advice
            base[SUMMARY_SNAPSHOT_S] = statistics.median(self.snapshot_s.values())
        if self.monitor is None:
            return base
        try:
            return {**base, **self.monitor.summary()}
        except Exception:
            log.exception("monitor summary failed")
            return base

    # --- outcome --------------------------------------------------------------------------

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


def _json_safe(value: Any) -> Any:
    """NaN/Infinity are not JSON: send them as null (the metric was not a number)."""
    return None if isinstance(value, float) and not math.isfinite(value) else value


def _cold_env(env: dict[str, str], cfg: AgentConfig) -> dict[str, str]:
    """A cold group's environment: with one rank, no torchrun sets the rank's variables."""
    if cfg.world_size > 1:
        return env
    return {
        **env,
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_WORLD_SIZE": "1",
        "GROUP_RANK": "0",
        "MASTER_ADDR": cfg.master_addr,
        "MASTER_PORT": str(cfg.master_port),
    }
