"""How the CLI prints: its two consoles (stdout, stderr) and the small formatters its tables share.

Every command module prints through `console` and `err` here, so a table is sized the same way
whichever command prints it.
"""

from __future__ import annotations

import os
import time
from typing import Any

from rich.console import Console

from aerie_contracts.states import AttemptState, JobState

# The width when the output is not a terminal: wide enough that every table takes its natural width.
UNBOUNDED_WIDTH = 10_000


class _FreshConsole:
    """rich's Console, made anew at each use: the width (COLUMNS) and the stream are read when
    printing, not when the module was imported (the CLI also runs in-process, under test runners
    and in the demo).

    Written to a file or a pipe, rich would squeeze every table to 80 columns (or to the width of
    whatever terminal stdin happens to be) and cut its headers (`ATTE…`); there the console is
    unbounded instead, so a table prints at the width of its content and a line is not wrapped.
    On a terminal, or with COLUMNS set, rich's width stands as it is."""

    def __init__(self, **options: Any) -> None:
        self._options = options

    def __getattr__(self, name: str) -> Any:
        return getattr(self._console(), name)

    def _console(self) -> Console:
        console = Console(**self._options)
        explicit = "width" in self._options or os.environ.get("COLUMNS", "").isdigit()
        if not explicit and not _isatty(console.file):
            console.width = UNBOUNDED_WIDTH
        return console


def _isatty(stream: Any) -> bool:
    """Whether the stream is a terminal, whatever rich is told (FORCE_COLOR makes it colour a pipe,
    not size it): only a terminal has a width to fit."""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or closed
        return False


console = _FreshConsole()
err = _FreshConsole(stderr=True)


def _age(t: float | None) -> str:
    if not t:
        return "-"
    s = int(time.time() - t)
    return f"{s}s" if s < 120 else f"{s // 60}m" if s < 7200 else f"{s // 3600}h"


def _bytes(n: int | None) -> str:
    """A size as people read it (decimal units, like S3's console)."""
    if n is None:
        return "-"
    size = float(n)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if size < 1000 or unit == "TB":
            return f"{n} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return str(n)


def _state(state: str) -> str:
    color = {
        JobState.COMPLETED: "green",
        JobState.FAILED: "red",
        JobState.STOPPED: "yellow",
        JobState.IN_PROGRESS: "cyan",
        AttemptState.RUNNING: "cyan",
    }.get(state)
    return f"[{color}]{state}[/{color}]" if color else state
