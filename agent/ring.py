"""Bounded time series: the one data structure every probe samples into.

A deque with ``maxlen`` keeps memory flat however long the job runs; the detectors only ever
look at the last minutes.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Any


class Ring:
    """``(t, value)`` samples, oldest first, at most ``maxlen`` of them."""

    def __init__(self, maxlen: int = 600):
        self._items: deque[tuple[float, Any]] = deque(maxlen=maxlen)

    def append(self, t: float, value: Any) -> None:
        self._items.append((t, value))

    def since(self, t0: float) -> list[tuple[float, Any]]:
        """Samples with ``t >= t0`` (walks from the newest end: cheap for short windows)."""
        out = []
        for item in reversed(self._items):
            if item[0] < t0:
                break
            out.append(item)
        out.reverse()
        return out

    def last(self) -> tuple[float, Any] | None:
        return self._items[-1] if self._items else None

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[tuple[float, Any]]:
        return iter(self._items)
