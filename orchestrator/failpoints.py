"""Failpoints: die at a named place, for crash tests.

`AERIE_FAILPOINT=<name>` makes the process SIGKILL itself the first time it reaches `hit(name)`,
which is exactly what a power cut or OOM-kill at that line would do. Unset (always, outside
tests), `hit` is a dictionary lookup.
"""

from __future__ import annotations

import os
import signal

from aerie_contracts import env

_ARMED = os.environ.get(env.FAILPOINT, "")


def hit(name: str) -> None:
    if _ARMED and name == _ARMED:
        os.kill(os.getpid(), signal.SIGKILL)
