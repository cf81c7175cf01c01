"""What one node's supervisor knows, shared by its phases (agent/supervisor.py composes them).

Each phase is a module of its own (agent/lifecycle.py, in_place.py, spare.py, inputs.py,
memory_tier.py, node_progress.py, outcome.py) and a class over this state; they call one another
through `self`, since a node's life is one sequence over one set of facts (its configuration,
its ranks' process, the verdict, the stop request). The state is set up here, in one place, so a
reader sees every field a phase may read or change.
"""

from __future__ import annotations

import subprocess
import threading
from typing import Any

from agent.config import AgentConfig
from agent.progress_sources import make_monitor
from agent.warm import WarmGroup

TERM_GRACE_S = 10.0  # after a stop request: time to finish the step and an in-flight save
VERDICT_GRACE_S = 1.0  # after a verdict: the ranks are hung or diverged, nothing to save; a restart waits on it


class NodeState:
    """The node's facts; `cfg` is the agent's configuration, health settings parsed once in it."""

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
