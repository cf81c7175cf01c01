"""One line for a trainer Aerie did not write: ``from aerie_report import report; report(step=..., loss=...)``.

Appends a record to Aerie's metrics stream (`$AERIE_METRICS_PATH/rank-<RANK:05d>.jsonl`, the
contract in docs/architecture.md), which the node's agent reads exactly like Aerie's own trainer's:
every reported step is progress for the hang detectors, its loss feeds `loss.nan`/`loss.spike`,
and rank 0's steps become the job's curves in the API. Call it from every rank (or at least from
one rank per node) once per optimizer step.

Standard library only (plus `aerie_contracts`, itself standard library only). Outside Aerie
(no `AERIE_METRICS_PATH`, `AERIE_ML_ROOT` or `SM_OUTPUT_DATA_DIR`) it does nothing, so the same
script runs anywhere. It never raises: a failed write loses one record, not the training run.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

from aerie_contracts import byo
from aerie_contracts import env as E

__all__ = ["metrics_path", "report"]

_STEP_KEYS = ("loss", "grad_norm", "lr", "tokens", "step_s")
_lock = threading.Lock()
_files: dict[tuple[int, str], Any] = {}  # (pid, path) -> open file: a forked child opens its own


def metrics_path(environ: dict[str, str] | None = None) -> Path | None:
    """This rank's metrics file, or None outside Aerie."""
    environ = dict(os.environ if environ is None else environ)
    directory = environ.get(E.METRICS_PATH)
    if not directory:
        if environ.get("SM_OUTPUT_DATA_DIR"):
            directory = str(Path(environ["SM_OUTPUT_DATA_DIR"]) / "metrics")
        elif environ.get(E.ML_ROOT):
            directory = str(Path(environ[E.ML_ROOT]) / "output" / "metrics")
        else:
            return None
    rank = int(environ.get("RANK", "0") or 0)
    return Path(directory) / f"rank-{rank:05d}.jsonl"


def report(step: int, loss: float | None = None, **metrics: Any) -> bool:
    """Record one training step (`grad_norm`, `lr`, `tokens`, `step_s` and any other number may
    be given by keyword). Returns whether the record was written."""
    path = metrics_path()
    if path is None:
        return False
    try:
        record: dict[str, Any] = {"t": time.time(), "rank": int(os.environ.get("RANK", "0") or 0), "step": int(step)}
        record["loss"] = _number(loss)
        for key in _STEP_KEYS[1:]:
            record[key] = _number(metrics.pop(key, None))
        record["event"] = None
        record.update({k: _number(v) for k, v in metrics.items()})
        record[byo.SOURCE_KEY] = byo.SOURCE_REPORT
        line = json.dumps(record) + "\n"  # NaN/Infinity as Python's json writes them: loss.nan reads them
        with _lock:
            f = _files.get((os.getpid(), str(path)))
            if f is None:
                path.parent.mkdir(parents=True, exist_ok=True)
                f = _files[(os.getpid(), str(path))] = open(path, "a", encoding="utf-8")
            f.write(line)
            f.flush()
        return True
    except (OSError, ValueError, TypeError):
        return False


def _number(value: Any) -> float | int | None:
    """A metric as a JSON number (tensors and numpy scalars through float()); None stays None."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number
