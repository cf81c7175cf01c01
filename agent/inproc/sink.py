"""Where the probe's findings go: the rank's metrics stream, its state file and its stack dumps.

Records are appended to `<AERIE_METRICS_PATH>/rank-<R:05d>.jsonl`, the file `agent.rank`'s log
parser also appends to: one `os.write` of whole lines per batch on an `O_APPEND` descriptor, so two
writers' lines never interleave mid-line. Step records are batched and serialised off the step path
(by the runtime's thread, every `FLUSH_S`); events (a save or an eval begins) are written at once,
since the save that follows may block the loop for minutes.

The state file (aerie_contracts.probe.STATE_FILE) is a shared mapping of a fixed size, rewritten in
place at every collective's entry and exit: a memory copy, no system call, so it costs the step
path nothing, and it stays readable while the rank is stopped or hung. The stack dump is
`faulthandler`'s, on the contract's signal, written by the interpreter without running Python.

Everything is opened lazily, by the process that first has something to say (`claim`): a launcher
or a DataLoader worker that imports torch but never trains leaves no file, and a warm rank learns
its real rank only once its group starts. Paths come from the environment the agent exports.
"""

from __future__ import annotations

import faulthandler
import json
import mmap
import os
import threading
import time
from pathlib import Path
from typing import IO, Any

from aerie_contracts import env
from aerie_contracts import probe as contract
from aerie_contracts.container import DEFAULT_ML_ROOT

FLUSH_S = 0.5  # step records reach the stream at most this late


def _ml_root() -> Path:
    return Path(os.environ.get(env.ML_ROOT) or DEFAULT_ML_ROOT)


def metrics_dir() -> Path:
    return Path(os.environ.get(env.METRICS_PATH) or _ml_root() / "output" / "metrics")


def ranks_dir() -> Path:
    return Path(os.environ.get(env.NODE_DIR) or _ml_root() / "agent") / "ranks"


class Sink:
    """One rank's open files and its pending records (thread-safe: the runtime's thread flushes)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pending: list[dict[str, Any]] = []  # records, serialised when written
        self.last_flush = 0.0
        self.rank: int | None = None
        self.pid = os.getpid()
        self._fd: int | None = None
        self._state: mmap.mmap | None = None
        self._stacks: IO[str] | None = None

    def claim(self, rank: int) -> None:
        """Open this rank's files (again, if the rank changed: a warm rank's group regrouped it)."""
        if rank == self.rank and self._fd is not None:
            return
        self.close()
        self.rank = rank
        path = metrics_dir() / f"rank-{rank:05d}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        ranks = ranks_dir()
        try:
            ranks.mkdir(parents=True, exist_ok=True)
            self._open_state(ranks / contract.STATE_FILE.format(rank=rank))
            self._register_stacks(ranks / contract.STACKS_FILE.format(rank=rank))
            # The pid at once: the diagnosis signals only a rank whose state names it, and a rank
            # whose collectives are all C++ (DDP's broadcast and all-reduces) may never update it.
            self.state(0, None, None)
        except OSError:
            pass  # the diagnosis loses this rank's state; its progress is still reported

    def _open_state(self, path: Path) -> None:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            os.ftruncate(fd, contract.STATE_SIZE)
            self._state = mmap.mmap(fd, contract.STATE_SIZE)
        finally:
            os.close(fd)

    def _register_stacks(self, path: Path) -> None:
        signum = contract.stack_signal()
        if signum is None:
            return
        before = self._stacks
        self._stacks = open(path, "w")  # kept open: faulthandler writes to it for the process's life
        faulthandler.register(signum, file=self._stacks, all_threads=True, chain=False)
        if before is not None:
            before.close()  # a regrouped rank's old file, no longer registered

    def state(self, collectives: int, inside: str | None, step: int | None) -> None:
        """Rewrite the state file in place (a memory copy)."""
        mm = self._state
        if mm is None:
            return
        name = "null" if inside is None else f'"{inside}"'
        text = (
            f'{{"{contract.STATE_COLLECTIVES}": {collectives}, "{contract.STATE_IN_COLLECTIVE}": {name}, '
            f'"{contract.STATE_STEP}": {"null" if step is None else step}, "{contract.STATE_PID}": {self.pid}, '
            f'"{contract.STATE_T}": {time.time():.3f}}}'
        ).encode()
        mm[: contract.STATE_SIZE] = text[: contract.STATE_SIZE].ljust(contract.STATE_SIZE)

    def add(self, record: dict[str, Any], now: bool = False) -> None:
        """Queue `record` (not changed after this); `now`: write it, and what is queued, at once."""
        with self.lock:
            self.pending.append(record)
        if now:
            self.flush()

    def flush(self) -> None:
        with self.lock:
            if not self.pending or self._fd is None or os.getpid() != self.pid:
                return
            records, self.pending = self.pending, []
            self.last_flush = time.monotonic()
            data = "".join(json.dumps(r, allow_nan=True) + "\n" for r in records).encode()
            os.write(self._fd, data)

    def close(self) -> None:
        if self._fd is not None:
            self.flush()
            os.close(self._fd)
            self._fd = None
        if self._state is not None:
            self._state.close()
            self._state = None
        # The stack handler stays registered (its file open) to the process's end: the state file
        # still names this pid, and a diagnosis during the interpreter's finalization must get a
        # dump, not the signal's default action (it killed a rank that had trained every step).
