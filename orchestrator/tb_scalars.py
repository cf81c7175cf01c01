"""Write TensorBoard scalars from the control plane (tensorboardX: no torch, no TensorFlow).

The human eval's score (`eval/human_score`, `eval/hallucination_rate`) is known only to the API,
so the API writes it, into the job's TensorBoard directory beside the trainer's curves.

Ratings change after the fact, so each update rewrites the whole series into a new event file
opened with `purge_step` = the series' first step: tensorboardX starts that file with a
`SessionLog.START` at that step, TensorBoard's sign that a run restarted, and its loader drops the
run's older points from that step on ("purge orphaned data", on by default), so what it shows is
the latest series. The human eval therefore gets a run (directory) of its own. TensorBoard reads
a run's files in name order: the suffix carries a nanosecond clock so updates within one second
keep their order (and never share a name). tensorboardX is imported only when a rating arrives.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

_lock = threading.Lock()  # one update at a time, so file order is write order

Series = list[tuple[int, dict[str, float]]]


def write_series(directory: str | Path, read: Callable[[], Series]) -> None:
    """Points (step, {tag: value}) replace the run's earlier points from the first step on.

    `read` is called under the lock: two updates racing each other (one per rating) then write in
    the order they read, so the newest file always holds the newest data. Reading before taking
    the lock let an older tally land last and win."""
    with _lock:
        points = sorted(read(), key=lambda p: p[0])
        if not points:
            return
        from tensorboardX import SummaryWriter

        suffix = f".aerie.{time.time_ns():020d}"
        writer = SummaryWriter(str(directory), purge_step=points[0][0], filename_suffix=suffix)
        try:
            for step, values in points:
                for tag, value in values.items():
                    writer.add_scalar(tag, value, step)
        finally:
            writer.close()  # joins tensorboardX's writer thread: the file is complete on return
