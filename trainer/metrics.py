"""The trainer's metrics: the JSONL stream the agent reads, and TensorBoard scalars for people.

JSONL (the contract in docs/architecture.md, its names in `aerie_contracts.metrics`): one object
per line, appended and flushed at once, to `$AERIE_METRICS_PATH/rank-<RANK:05d>.jsonl`, keys `t,
rank, step, loss, grad_norm, lr, tokens, step_s, event` always present (null where they do not
apply), plus extras (`compute_s`, `wait_s`, `mfu`, `tokens_per_s`, `tokens_per_dollar`, `uri`,
`stall_s`, `upload_s`, ...). A non-finite loss is written as `NaN`/`Infinity` (what Python's
json reads back), so the agent's `loss.nan` detector sees it. Without `AERIE_METRICS_PATH` the
stream goes to `<output>/metrics/`, where `<output>` is `SM_OUTPUT_DATA_DIR`, else
`$AERIE_ML_ROOT/output`, else `./output`.

TensorBoard (rank 0 only), under `<output>/tensorboard`: scalars `loss`, `grad_norm`, `lr`,
`tokens_per_s`, `mfu`, `tokens_per_dollar` (when a price is known) and `eval_loss`, with the step
as the x axis.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from pathlib import Path
from typing import Any

from aerie_contracts import env
from aerie_contracts import metrics as keys
from aerie_contracts.metrics import STEP_KEYS

TENSORBOARD_SCALARS = ("loss", "grad_norm", "lr", "tokens_per_s", "mfu", "tokens_per_dollar", "eval_loss")


def output_dir() -> Path:
    if os.environ.get("SM_OUTPUT_DATA_DIR"):
        return Path(os.environ["SM_OUTPUT_DATA_DIR"])
    if os.environ.get(env.ML_ROOT):
        return Path(os.environ[env.ML_ROOT]) / "output"
    return Path("output")


def metrics_dir() -> Path:
    return Path(os.environ.get(env.METRICS_PATH) or output_dir() / "metrics")


def tensorboard_dir() -> Path:
    return output_dir() / "tensorboard"


class MetricsWriter:
    """One per rank. Thread-safe: checkpoint completions are reported from a background thread."""

    def __init__(
        self,
        rank: int,
        directory: str | Path | None = None,
        tensorboard: str | Path | None = None,
        enable_tensorboard: bool | None = None,
    ) -> None:
        self.rank = rank
        self._lock = threading.Lock()
        path = Path(directory) if directory is not None else metrics_dir()
        path.mkdir(parents=True, exist_ok=True)
        self.path = path / f"rank-{rank:05d}.jsonl"
        self._file = self.path.open("a", encoding="utf-8")
        self._tb = None
        if enable_tensorboard if enable_tensorboard is not None else rank == 0:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(tensorboard if tensorboard is not None else tensorboard_dir()))

    def _write(self, record: dict[str, Any]) -> None:
        line = json.dumps(record, default=float) + "\n"
        with self._lock:
            if self._file.closed:
                return
            self._file.write(line)
            self._file.flush()

    def step(
        self, step: int, *, loss: float, grad_norm: float, lr: float, tokens: int, step_s: float, **extra: float | None
    ) -> None:
        """A training step's line (event null) and, on rank 0, its TensorBoard points."""
        record = {
            keys.T: time.time(),
            keys.RANK: self.rank,
            keys.STEP: step,
            keys.LOSS: loss,
            keys.GRAD_NORM: grad_norm,
            keys.LR: lr,
            keys.TOKENS: tokens,
            keys.STEP_S: step_s,
            keys.EVENT: None,
        }
        record.update(extra)
        self._write(record)
        self.scalars(step, loss=loss, grad_norm=grad_norm, lr=lr, **extra)

    def event(self, event: str, step: int, **fields: Any) -> None:
        """An event line (`aerie_contracts.metrics.MetricEvent`): checkpoint_begin/staged/end/committed
        (with `uri`), eval_begin/eval_end."""
        record: dict[str, Any] = {keys.T: time.time(), keys.RANK: self.rank, keys.STEP: step}
        record.update({key: None for key in STEP_KEYS})
        record[keys.EVENT] = str(event)
        record.update(fields)
        self._write(record)

    def scalars(self, step: int, **values: float | None) -> None:
        if self._tb is None:
            return
        with self._lock:
            for name, value in values.items():
                if value is not None and name in TENSORBOARD_SCALARS and math.isfinite(float(value)):
                    self._tb.add_scalar(name, float(value), step)
            self._tb.flush()

    def close(self) -> None:
        with self._lock:
            self._file.close()
            if self._tb is not None:
                self._tb.close()
                self._tb = None
