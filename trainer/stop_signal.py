"""A stop request (SIGTERM/SIGINT) for the training loop, and the grace a rank has after one.

The handler only records the signal: the loop finishes the step in progress, agrees with its peers
on stopping (one collective) and leaves with 128 + the signal's number (trainer/train.py).
"""

from __future__ import annotations

import os
import signal

from aerie_contracts import env

STOP_GRACE_S = float(os.environ.get(env.STOP_GRACE_S, "60"))


class StopRequest:
    """Set by SIGTERM/SIGINT; the loop checks it (agreed across ranks) after each step."""

    def __init__(self) -> None:
        self.signum = 0

    def install(self) -> None:
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._handle)

    def _handle(self, signum, frame) -> None:
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum if self.signum else 0
