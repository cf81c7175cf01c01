"""The one way the harness, the benches and the tests wait for something that happens in another
process or thread."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(check: Callable[[], T], timeout_s: float = 30.0, what: str = "the condition", every_s: float = 0.1) -> T:
    """Call `check` every `every_s` until it returns something truthy, and return that; after
    `timeout_s`, fail naming `what`. The timeout is a ceiling for a loaded CI machine, not a
    speed goal (those live in bench/)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(every_s)
