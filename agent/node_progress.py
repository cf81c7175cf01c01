"""What the node tells the control plane about its ranks' progress: committed checkpoints seen in
the metrics stream, rank 0's training steps (batched), and each heartbeat's summary (the monitor's
plus the goodput ledger's restore and snapshot times).
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from typing import Any

from aerie_contracts import byo
from aerie_contracts import metrics as metric_keys
from aerie_contracts.goodput import SUMMARY_RESTORE_S, SUMMARY_RESTORED_STEP, SUMMARY_SNAPSHOT_S
from aerie_contracts.metrics import MetricEvent
from agent.node_state import NodeState

log = logging.getLogger("aerie.agent")

# Rank 0's training steps forwarded to the control plane (POST .../metrics), batched.
METRIC_KEYS = ("t", "step", "loss", "grad_norm", "lr", "tokens_per_s", "mfu", "tokens_per_dollar")
METRICS_EVERY_S = 2.0
METRICS_BATCH = 500
SNAPSHOTS_KEPT = 16  # the memory tier's recent snapshot stalls the heartbeat's median is taken over


class ProgressForwarding(NodeState):
    """Checkpoints, metrics and the heartbeat's summary, from the monitor's last sample."""

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


def _json_safe(value: Any) -> Any:
    """NaN/Infinity are not JSON: send them as null (the metric was not a number)."""
    return None if isinstance(value, float) and not math.isfinite(value) else value
