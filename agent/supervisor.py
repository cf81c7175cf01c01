"""Run the node's ranks, watch them, and end them fast when something is silently wrong.

One supervisor per node. It starts the entrypoint (through torchrun when the job has more than
one rank), ticks the monitor every `sample_s`, sends heartbeats every `heartbeat_s`, and on a
verdict posts it and stops the ranks' process tree (SIGTERM, grace, SIGKILL), so the attempt
fails in seconds with a named cause instead of waiting out a collective timeout. The agent is a
child subreaper, so no rank of the tree outlives the node (see `_become_subreaper`).
"""

from __future__ import annotations

import ctypes
import json
import logging
import math
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from aerie_contracts import byo
from aerie_contracts import env as E
from aerie_contracts.env import SECTIONS
from aerie_contracts.failures import STOPPED_ON_REQUEST, FailureKind
from aerie_contracts.goodput import SUMMARY_RESTORE_S
from aerie_contracts.health import merge_learned
from aerie_contracts.metrics import MetricEvent
from agent.contract import DATA_DOWNLOAD, read_json, trainer_env, write_json
from agent.identity import IdentityError, NodeIdentity, ml_root, resolve_identity

log = logging.getLogger("aerie.agent")

TERM_GRACE_S = 10.0  # after a stop request: time to finish the step and an in-flight save
VERDICT_GRACE_S = 3.0  # after a verdict: the ranks are hung or diverged, there is nothing to save
PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h
# Rank 0's training steps forwarded to the control plane (POST .../metrics), batched.
METRIC_KEYS = ("t", "step", "loss", "grad_norm", "lr", "tokens_per_s", "mfu", "tokens_per_dollar")
METRICS_EVERY_S = 2.0
METRICS_BATCH = 500


@dataclass(frozen=True)
class AgentConfig:
    """Everything the agent needs, read once from the contract environment."""

    ml_root: Path
    node_dir: Path
    metrics_dir: Path
    hosts: tuple[str, ...]
    host: str
    entrypoint: tuple[str, ...]
    procs_per_node: int = 1
    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    workdir: Path = Path(".")
    api: str = ""
    token: str = ""
    attempt: str = ""
    health: dict[str, Any] = field(default_factory=dict)
    learned: dict[str, list[float]] = field(default_factory=dict)  # AERIE_SECTIONS
    interfaces: tuple[str, ...] = ()
    identity: NodeIdentity | None = None  # where hosts/host/master came from (None: given directly)

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> AgentConfig:
        """Identity from the platform's contract (`agent.identity`: resourceconfig.json first),
        the job from Aerie's AERIE_* variables."""
        env = dict(os.environ if env is None else env)
        try:
            ident = resolve_identity(env)
        except IdentityError as exc:
            # The node cannot start: say why where SageMaker (FailureReason) and the backends look.
            _write_failure(ml_root(env), {"kind": FailureKind.LAUNCH_FAILED, "message": str(exc)})
            raise SystemExit(f"agent: {exc}") from exc
        entry = json.loads(env[E.ENTRYPOINT]) if env.get(E.ENTRYPOINT) else []
        if not entry:
            raise SystemExit("agent: AERIE_ENTRYPOINT is empty: nothing to run")
        return cls(
            ml_root=ident.ml_root,
            node_dir=ident.node_dir,
            metrics_dir=Path(env.get(E.METRICS_PATH) or ident.metrics_dir),
            hosts=ident.hosts,
            host=ident.current_host,
            entrypoint=tuple(entry),
            procs_per_node=int(env.get(E.PROCS_PER_NODE, "1")),
            master_addr=ident.master_addr,
            master_port=ident.master_port,
            workdir=Path(env.get(E.WORKDIR, os.getcwd())),
            api=env.get(E.API, ""),
            token=env.get(E.AGENT_TOKEN, ""),
            attempt=env.get(E.ATTEMPT, ""),
            health=json.loads(env.get(E.HEALTH) or "{}"),
            learned=_learned_sections(env.get(SECTIONS)),
            interfaces=tuple(i.strip() for i in ident.network_interface.split(",") if i.strip()),
            identity=ident,
        )

    @property
    def node_rank(self) -> int:
        return self.hosts.index(self.host)

    @property
    def node_identity(self) -> NodeIdentity:
        if self.identity is not None:
            return self.identity
        return NodeIdentity(
            self.ml_root,
            self.hosts,
            self.host,
            self.master_addr,
            self.master_port,
            network_interface=",".join(self.interfaces),
        )

    @property
    def world_size(self) -> int:
        return len(self.hosts) * self.procs_per_node


def rank_command(cfg: AgentConfig) -> list[str]:
    """The argv that starts this node's ranks, each under the `agent.rank` wrapper."""
    wrapped = [sys.executable, "-m", "agent.rank", "--", *cfg.entrypoint]
    if cfg.world_size == 1:
        return wrapped
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nnodes={len(cfg.hosts)}",
        f"--nproc-per-node={cfg.procs_per_node}",
        f"--node-rank={cfg.node_rank}",
        f"--master-addr={cfg.master_addr}",
        f"--master-port={cfg.master_port}",
        "--max-restarts=0",
        "--monitor-interval=1",
        "--no-python",
        *wrapped,
    ]


class Supervisor:
    def __init__(self, cfg: AgentConfig, monitor: Any = None, reporter: Any = None):
        from agent.report import Reporter

        self.cfg = cfg
        self.monitor = monitor if monitor is not None else _make_monitor(cfg)
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
        self.data_download: dict[str, Any] | None = None  # agent.channels.receive's record
        self.restore_s: float | None = None  # the slowest of this node's ranks' checkpoint restores
        self.input_failure: dict[str, Any] | None = None
        self.restore_failure: dict[str, Any] | None = None
        self.checkpoints: Any = None  # agent.byo_checkpoints.CheckpointSync for a third-party trainer

    # --- lifecycle ------------------------------------------------------------------------

    def run(self) -> int:
        cfg = self.cfg
        cfg.node_dir.mkdir(parents=True, exist_ok=True)
        (cfg.node_dir / "ranks").mkdir(exist_ok=True)
        cfg.metrics_dir.mkdir(parents=True, exist_ok=True)
        write_json(cfg.node_dir / "agent.pid", os.getpid())
        signal.signal(signal.SIGTERM, self._on_stop_signal)
        signal.signal(signal.SIGINT, self._on_stop_signal)
        _become_subreaper()
        if not self._receive_inputs():
            return self._finish(1)
        if not self._restore_checkpoint():
            return self._finish(1)

        env = dict(os.environ)
        # SageMaker sets no SM_* at all: the agent does, as its training toolkit would, and points
        # the ranks at the agent's own directory (pid and exit files) and the metrics stream.
        env.update(trainer_env(cfg.node_identity, env))
        env.update({E.NODE_DIR: str(cfg.node_dir), E.METRICS_PATH: str(cfg.metrics_dir)})
        if self.checkpoints is not None:
            env[E.CHECKPOINT_DIR] = str(self.checkpoints.root)
        env.setdefault("OMP_NUM_THREADS", "1")  # what torchrun would pick, without its banner
        if cfg.world_size == 1:
            env.update(
                {
                    "RANK": "0",
                    "LOCAL_RANK": "0",
                    "WORLD_SIZE": "1",
                    "LOCAL_WORLD_SIZE": "1",
                    "GROUP_RANK": "0",
                    "MASTER_ADDR": cfg.master_addr,
                    "MASTER_PORT": str(cfg.master_port),
                }
            )
        cmd = rank_command(cfg)
        log.info("starting %d rank(s) on %s: %s", cfg.procs_per_node, cfg.host, " ".join(cfg.entrypoint))
        # Own session: the whole rank tree can be signalled at once, and only it.
        self.proc = subprocess.Popen(
            cmd, cwd=str(cfg.workdir), env=env, start_new_session=True, stdin=subprocess.DEVNULL
        )
        write_json(cfg.node_dir / "trainer.pgid", self.proc.pid)

        sample_s = float(cfg.health.get("sample_s", 1.0))
        heartbeat_s = float(cfg.health.get("heartbeat_s", 5.0))
        next_beat = 0.0
        while self.proc.poll() is None:
            now = time.time()
            self._tick(now)
            if now >= next_beat:
                self.reporter.heartbeat(self._summary())
                next_beat = now + heartbeat_s
            self._escalate(now)
            time.sleep(min(sample_s, 0.5) if self._term_sent_at else sample_s)
        self._tick(time.time(), detect=False)  # pick up the last metrics lines (checkpoints)
        if self.proc.returncode == 0 and self.verdict is None and not self.stop_requested:
            self._drain_checkpoints()
        leftovers = self._kill_tree()  # what torchrun left behind, if anything
        psutil.wait_procs(leftovers, timeout=5)  # adopted by this subreaper: reap them
        return self._finish(self.proc.returncode)

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
            beat = {"t": time.time(), "host": cfg.host, "phase": DATA_DOWNLOAD, DATA_DOWNLOAD: progress}
            self.reporter.heartbeat(beat)  # the control plane sees the node alive while it downloads

        try:
            self.data_download = channels.receive(
                cfg.ml_root, os.environ, cfg.hosts, cfg.host, stop=self._stop, notify=notify
            )
        except channels.InputUnavailable as exc:
            log.error("%s", exc)
            self.input_failure = exc.reason(cfg.host)
            return False
        except Cancelled:
            return False  # a stop request: the outcome is user.stop
        channels.write_record(cfg.node_dir, self.data_download)
        if self.monitor is not None and hasattr(self.monitor, "started_at"):
            self.monitor.started_at = time.time()  # startup grace and first-step timeout start with the ranks
        return True

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
            _killpg(self.proc.pid, signal.SIGTERM)
            _killpg(self.proc.pid, signal.SIGCONT)  # a stopped rank can only act on SIGTERM once resumed

    def _escalate(self, now: float) -> None:
        if self._term_sent_at and now - self._term_sent_at > self._grace_s and self.proc:
            self._kill_tree()

    def _kill_tree(self) -> list[psutil.Process]:
        """SIGKILL the rank tree: torchrun's process group, and every descendant of this process
        whatever its session (torchrun puts each worker in a session of its own, out of reach of
        the killpg). This process has no children but the rank tree. Returns the processes
        signalled, except the rank command itself (`self.proc`, which Popen reaps)."""
        assert self.proc is not None
        _killpg(self.proc.pid, signal.SIGKILL)
        try:
            tree = psutil.Process().children(recursive=True)
        except psutil.Error:
            return []
        for proc in tree:
            try:
                proc.kill()
            except psutil.Error:
                pass
        return [proc for proc in tree if proc.pid != self.proc.pid]

    # --- monitoring -----------------------------------------------------------------------

    def _tick(self, now: float, detect: bool = True) -> None:
        from agent.chaos import apply_pending

        apply_pending(self.cfg.node_dir, self.cfg.interfaces)  # `aerie chaos` requests, if any
        if self.checkpoints is not None:
            self.checkpoints.tick(now)  # uploads run in a thread of their own: training goes on
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

    def _report_checkpoints(self) -> None:
        """Tell the control plane about committed checkpoints seen in the metrics stream."""
        sample = getattr(self.monitor, "last_sample", None) or {}
        for rec in sample.get("records", []):
            self._note_restore(rec)
            uri = rec.get("uri")
            if rec.get("event") == "checkpoint_committed" and uri and uri not in self._reported_checkpoints:
                self._reported_checkpoints.add(uri)
                self.reporter.checkpoint({"step": rec.get("step"), "uri": uri, "meta": rec})

    def _note_restore(self, rec: dict[str, Any]) -> None:
        seconds = rec.get("restore_s") if rec.get("event") == MetricEvent.RESTORED else None
        if isinstance(seconds, (int, float)) and not isinstance(seconds, bool) and 0 <= seconds < 1e7:
            self.restore_s = max(self.restore_s or 0.0, float(seconds))

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
        base: dict[str, Any] = {"t": time.time()}
        if self.data_download is not None:
            base[DATA_DOWNLOAD] = self.data_download  # for the goodput ledger
        if self.restore_s is not None:
            base[SUMMARY_RESTORE_S] = self.restore_s  # for the goodput ledger
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
        write_json(self.cfg.node_dir / "exit.json", outcome)
        if code != 0 and reason:
            _write_failure(self.cfg.ml_root, reason)
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
        since = time.time()
        self.reporter.heartbeat(
            {**self._summary(), contract.PHASE: contract.PHASE_UPLOADING, contract.PHASE_SINCE: since}
        )
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


def _write_failure(ml_root: Path, reason: dict[str, Any]) -> None:
    """`output/failure`: "<kind>: <message>", the line SageMaker quotes in FailureReason."""
    failure = ml_root / "output" / "failure"
    try:
        failure.parent.mkdir(parents=True, exist_ok=True)
        failure.write_text(f"{reason.get('kind')}: {reason.get('message', '')}\n")
    except OSError:
        log.exception("cannot write %s", failure)


def _json_safe(value: Any) -> Any:
    """NaN/Infinity are not JSON: send them as null (the metric was not a number)."""
    return None if isinstance(value, float) and not math.isfinite(value) else value


def _make_monitor(cfg: AgentConfig) -> Any:
    if not cfg.health.get("enabled", True):
        return None
    try:
        from agent.monitor import Monitor
    except ImportError:  # pragma: no cover - the monitor ships with the agent
        return None
    monitor = Monitor(
        node_dir=cfg.node_dir,
        metrics_dir=cfg.metrics_dir,
        health=cfg.health,
        interfaces=list(cfg.interfaces) or None,
        host=cfg.host,
        sample_s=float(cfg.health.get("sample_s", 1.0)),
        started_at=time.time(),
        learned=cfg.learned,
    )
    monitor.blind_until_first_step = not prints_progress(cfg, E.LOG_METRICS.get())
    return monitor


def prints_progress(cfg: AgentConfig, log_metrics: str | None) -> bool:
    """Whether this node hosts the rank whose output carries progress. Always, unless progress
    comes from log lines of a trainer that prints on one rank only (aerie_contracts.byo.PRINTING_RANK)."""
    if not log_metrics:
        return True
    try:
        preset = json.loads(log_metrics).get("preset")
    except (ValueError, AttributeError):
        return True
    rank = byo.PRINTING_RANK.get(preset, 0) % cfg.world_size
    return rank // cfg.procs_per_node == cfg.node_rank


def _learned_sections(text: str | None) -> dict[str, list[float]]:
    """`AERIE_SECTIONS`, validated: a malformed value costs the learned limits, never the node."""
    try:
        return merge_learned([json.loads(text)]) if text else {}
    except (ValueError, TypeError, AttributeError):
        log.warning("ignoring malformed %s: %.200s", SECTIONS, text)
        return {}


def _become_subreaper() -> None:
    """Adopt orphaned descendants instead of letting init adopt them.

    When the grace runs out the agent SIGKILLs torchrun, which then cannot stop its workers; a
    worker that ignores SIGTERM (a busy hang: exactly what a verdict stops) was adopted by init
    and kept its core or GPU forever after the node reported its end. Adopted by the agent, it
    stays a descendant that `_kill_tree` finds and reaps. Linux only (elsewhere: best effort)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        log.warning("cannot become a child subreaper: a rank that ignores SIGTERM may outlive the node")


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass
