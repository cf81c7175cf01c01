"""Where the node's progress comes from and who watches it: the monitor (detectors over the metrics
stream), which node hosts the rank that prints a third-party trainer's progress, and the tail of
its TensorBoard event files (agent.tb_progress) when the spec asks for one."""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from typing import Any

from aerie_contracts import byo
from aerie_contracts import env as E
from aerie_contracts.health import HealthSettings
from agent.config import AgentConfig

log = logging.getLogger("aerie.agent")


def make_monitor(cfg: AgentConfig) -> Any:
    if not cfg.health.enabled:
        return None
    try:
        from agent.monitor import Monitor
    except ImportError:  # pragma: no cover - the monitor ships with the agent
        return None
    monitor = Monitor(
        node_dir=cfg.node_dir,
        metrics_dir=cfg.metrics_dir,
        health=tb_health(cfg.health, E.LOG_METRICS.get()),
        interfaces=list(cfg.interfaces) or None,
        host=cfg.host,
        started_at=time.time(),
        learned=cfg.learned,
    )
    monitor.blind_until_first_step = not prints_progress(cfg, E.LOG_METRICS.get())
    return monitor


def prints_progress(cfg: AgentConfig, log_metrics: str | None) -> bool:
    """Whether this node hosts the rank whose output carries progress. Always, unless progress
    comes from log lines or TensorBoard files of a trainer that writes them on one rank only
    (aerie_contracts.byo.PRINTING_RANK; TensorBoard alone: global rank 0)."""
    if not log_metrics:
        return True
    try:
        json.loads(log_metrics).get("preset")
    except (ValueError, AttributeError):
        return True
    return progress_rank(cfg, log_metrics) // cfg.procs_per_node == cfg.node_rank


def progress_rank(cfg: AgentConfig, log_metrics: str | None) -> int:
    """The global rank that prints the trainer's progress and writes its TensorBoard events."""
    try:
        preset = json.loads(log_metrics or "{}").get("preset")
    except (ValueError, AttributeError):
        preset = None
    return byo.PRINTING_RANK.get(preset, 0) % cfg.world_size


def _tb_setting(log_metrics: str | None) -> dict[str, Any] | None:
    try:
        cfg = json.loads(log_metrics or "{}")
        return byo.validate_tensorboard(cfg["tensorboard"]) if cfg.get("tensorboard") is not None else None
    except (ValueError, AttributeError, TypeError):
        return None


def tb_health(health: HealthSettings, log_metrics: str | None) -> HealthSettings:
    """With TensorBoard as the only progress source, a step reaches the agent up to `flush_s` late
    (the writer's flush interval): the hang floor grows by that much, so a healthy run is not hung."""
    tb = _tb_setting(log_metrics)
    if tb is None or not tb["flush_s"]:
        return health
    cfg = json.loads(log_metrics or "{}")
    if cfg.get("preset") or cfg.get("definitions"):
        return health  # log lines carry the steps in real time; TensorBoard adds its metrics
    return dataclasses.replace(health, hang_floor_s=health.hang_floor_s + tb["flush_s"])


def make_tb_progress(cfg: AgentConfig) -> Any:
    """The node's tail of the trainer's TensorBoard directory, when the spec asks for one and this
    node hosts the writing rank; None otherwise (or when it cannot run: said in the node's log)."""
    value = E.LOG_METRICS.get()
    if _tb_setting(value) is None or not prints_progress(cfg, value):
        return None
    from agent.tb_progress import TensorBoardProgress

    try:
        return TensorBoardProgress.from_env(
            value, cfg.ml_root, cfg.metrics_dir, rank=progress_rank(cfg, value), since=time.time() - 1.0
        )
    except ImportError as exc:
        log.warning("metrics.tensorboard needs the tensorboard package on the node (%s): no progress from it", exc)
    except ValueError as exc:
        log.warning("ignoring malformed metrics.tensorboard: %s", exc)
    return None
