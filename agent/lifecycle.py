"""A node's lifecycle: set up, receive inputs, run worker groups one after another (the second
and later in place), and watch each one (tick the monitor, beat, stop the ranks on a verdict or a
stop request: SIGTERM, grace, SIGKILL to the whole tree).

The watch loop ticks the monitor every `health.sample_s` and beats every `health.heartbeat_s`
(the settings `AgentConfig.health` parsed once). What comes between groups lives in
agent/in_place.py (an in-place successor) and agent/spare.py (a hot spare's wait).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time

import psutil

from aerie_contracts import env as E
from aerie_contracts.container import write_json
from aerie_contracts.failures import FailureKind
from agent.byo_checkpoints import local_dir
from agent.config import AgentConfig, rank_command
from agent.diagnose import diagnose
from agent.node_state import TERM_GRACE_S, VERDICT_GRACE_S, NodeState
from agent.proctree import become_subreaper, kill_tree, killpg
from agent.progress_sources import make_tb_progress
from agent.toolkit_env import trainer_env

log = logging.getLogger("aerie.agent")

STALL_ASK_S = 0.5  # how often a node whose ranks stalled asks whether the attempt is over (NodeLifecycle._stalled)
# The verdicts whose ranks are asked for their stacks first (agent/diagnose.py): a stall, where the
# rank the others wait for is the cause.
DIAGNOSED = frozenset({FailureKind.SILENT_HANG, FailureKind.CHECKPOINT_STALLED})
WATCH_S = 0.1  # how often the watch loop looks for a dead rank (and how soon it sees the group end: at once)


class NodeLifecycle(NodeState):
    """`run`: the node from its start to its exit code, one worker group at a time."""

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
        env[E.PROBE] = cfg.health.probe  # agent.rank injects the in-process probe unless `off`
        # Always the node's own directory (/opt/ml/checkpoints under its ML root, as a container
        # has it), synced or not: a script that defaults to /opt/ml/checkpoints must never write
        # into the host's, where another job (or the next run) would resume from it.
        root = (
            self.checkpoints.root
            if self.checkpoints is not None
            else local_dir(E.CHECKPOINT_LOCAL_PATH.get(environ=env), cfg.ml_root)
        )
        env[E.CHECKPOINT_DIR] = str(root)
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
        evidence = v.evidence
        if v.kind in DIAGNOSED:
            # Each rank's stacks and collective count before they are stopped: the control plane
            # names the rank the others wait for from every node's (recovery/hang_root.py).
            ranks = diagnose(self.cfg.node_dir / "ranks")
            evidence = {**evidence, "ranks": ranks} if ranks else evidence
        self.verdict = {"kind": v.kind, "message": v.message, "evidence": evidence, "t": now, "host": self.cfg.host}
        log.error("verdict %s on %s: %s", v.kind, self.cfg.host, v.message)
        self.reporter.verdict(self.verdict)
        self._terminate_ranks(VERDICT_GRACE_S)
        self._prewarm()

    def _on_stop_signal(self, signum, _frame) -> None:
        self.stop_requested = True
        self._stop.set()
        self._terminate_ranks()

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
