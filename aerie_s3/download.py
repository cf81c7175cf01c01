"""Many objects to files at once: the ranged-GET engine writing into preallocated files.

Every object becomes `<path>.part` (allocated to its full size when its first bytes arrive; the
free space is checked before any byte moves), is filled by `aerie_s3.ranged` slices with `os.pwrite`, checked by
`aerie_s3.verify` the moment its last byte lands (while other objects keep downloading), and only
then renamed to `<path>`: a file at its final name is always a whole, verified object. An object
that fails its check is fetched once more before the download fails.

Writes and checks run on writer threads of their own: the CRT hands a slice over in whole parts,
and equal slices end together, so when each connection's thread wrote its own part every
connection sat idle while the page cache took a round's bytes (measured: a quarter of the time
through the throttling proxy, bench/data.py). A connection's thread now queues its part (at most
`connections` parts wait) and goes straight on to its next GET.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from aerie_s3.clients import boto3_client, new_boto3_client
from aerie_s3.listing import RemoteObject
from aerie_s3.ranged import fetch_ranges
from aerie_s3.settings import S3Settings
from aerie_s3.verify import ChecksumMismatch, Expected, expected_of, verify_file


@dataclass(frozen=True)
class Transfer:
    obj: RemoteObject
    path: Path  # where the verified object ends up


@dataclass
class DownloadStats:
    objects: int = 0
    bytes: int = 0
    seconds: float = 0.0
    verified: dict[str, int] = field(default_factory=dict)  # method ("CRC32", "MD5", "size"...) -> objects


def download(
    transfers: Sequence[Transfer],
    *,
    settings: S3Settings | None = None,
    connections: int | None = None,
    verify: bool = True,
    stop: threading.Event | None = None,
    on_bytes: Callable[[int], None] | None = None,
    on_done: Callable[[Transfer, str], None] | None = None,
) -> DownloadStats:
    """Download every transfer; `on_bytes(n)` as bytes land, `on_done(transfer, method)` per
    verified object. Raises the first error (nothing partial is left under a final name)."""
    settings = settings or S3Settings.from_env()
    connections = connections or settings.connections
    t0 = time.monotonic()
    stats = DownloadStats()
    client = boto3_client(settings, max_pool_connections=max(connections, 10))
    todo = list(transfers)
    for attempt in (1, 2):
        expected = _expectations(settings, todo, connections, verify)
        failed = _download_once(todo, expected, client, settings, connections, stop, on_bytes, on_done, stats)
        if not failed:
            break
        if attempt == 2:
            raise failed[0][1]
        todo = [t for t, _ in failed]  # fetched again once: an object rewritten mid-download, a bad read
    stats.seconds = time.monotonic() - t0
    return stats


def _expectations(settings: S3Settings, todo: list[Transfer], connections: int, verify: bool) -> list[Expected]:
    """What S3 says each object should hash to (HEADs, `connections` at once). On a client of its
    own, closed afterwards: its idle connections must not sit beside the transfer's."""
    if not verify or not todo:
        return [Expected(t.obj.size, t.obj.etag) for t in todo]
    workers = max(1, min(connections, len(todo)))
    client = new_boto3_client(settings, max_pool_connections=max(workers, 10))
    try:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            return list(pool.map(lambda t: expected_of(client, t.obj), todo))
    finally:
        client.close()


def _download_once(todo, expected, client, settings, connections, stop, on_bytes, on_done, stats):
    """One pass over `todo`; returns [(transfer, error)] of the objects that failed their check."""
    lock = threading.Lock()
    failed: list[tuple[Transfer, Exception]] = []
    files = _PartFiles(todo, expected)
    remaining = {i: exp.size for i, exp in enumerate(expected)}

    def finish(i: int) -> None:
        files.close(i)
        t, exp = todo[i], expected[i]
        try:
            method = verify_file(files.part(i), exp, client, t.obj)
        except ChecksumMismatch as exc:
            files.part(i).unlink(missing_ok=True)
            with lock:
                failed.append((t, exc))
            return
        os.replace(files.part(i), t.path)
        with lock:
            stats.objects += 1
            stats.bytes += exp.size
            stats.verified[method] = stats.verified.get(method, 0) + 1
        if on_done is not None:
            on_done(t, method)

    _check_space(todo, expected)
    writer = _Writer(workers=min(4, connections), max_pending=connections)
    ranges = []
    try:
        for i, t in enumerate(todo):
            if expected[i].size == 0:
                files.fd(i)
                finish(i)
            else:
                sink = _Sink(i, files, remaining, lock, on_bytes, finish, writer)
                ranges.append((t.obj.bucket, t.obj.key, 0, expected[i].size, sink))
        fetch_ranges(ranges, settings=settings, connections=connections, stop=stop)
        writer.close()
    except BaseException:
        writer.close(raise_error=False)  # no write may land after its file is closed
        files.discard()
        raise
    return failed


class _PartFiles:
    """The `.part` files of a pass, opened (and allocated) when their first bytes arrive, so only
    the objects in flight hold a descriptor, however many objects a channel has."""

    def __init__(self, todo, expected):
        self.todo, self.expected = todo, expected
        self.lock = threading.Lock()
        self.fds: dict[int, int] = {}
        self.opened: set[int] = set()

    def part(self, i: int) -> Path:
        return self.todo[i].path.with_name(self.todo[i].path.name + ".part")

    def fd(self, i: int) -> int:
        with self.lock:
            if i not in self.fds:
                path = self.part(i)
                path.parent.mkdir(parents=True, exist_ok=True)
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                self.fds[i] = fd
                self.opened.add(i)
                _allocate(fd, self.expected[i].size, path)
            return self.fds[i]

    def close(self, i: int) -> None:
        with self.lock:
            os.close(self.fds.pop(i))

    def discard(self) -> None:
        """After a failure: close everything, and delete what was not finished."""
        with self.lock:
            for fd in self.fds.values():
                os.close(fd)
            self.fds.clear()
            for i in self.opened:
                self.part(i).unlink(missing_ok=True)


def _check_space(todo: Sequence[Transfer], expected: Sequence[Expected]) -> None:
    """A full disk fails before any byte moves, with how much is needed and free."""
    need: dict[int, tuple[int, Path]] = {}
    for t, exp in zip(todo, expected):
        parent = t.path.parent
        parent.mkdir(parents=True, exist_ok=True)
        dev = parent.stat().st_dev
        total, _ = need.get(dev, (0, parent))
        need[dev] = (total + exp.size, parent)
    for total, parent in need.values():
        st = os.statvfs(parent)
        free = st.f_bavail * st.f_frsize
        if total > free:
            raise OSError(28, f"{total / 1e9:.2f} GB to download, {free / 1e9:.2f} GB free under {parent}")


class _Writer:
    """Writer threads with at most `max_pending` chunks queued; the first error is raised by the
    next `submit` (so the download stops) and by `close`."""

    def __init__(self, workers: int, max_pending: int):
        self.pool = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="s3-write")
        self.slots = threading.BoundedSemaphore(max(1, max_pending))
        self.error: BaseException | None = None

    def submit(self, fn, *args) -> None:
        if self.error is not None:
            raise self.error
        self.slots.acquire()

        def run():
            try:
                fn(*args)
            except BaseException as exc:
                self.error = self.error or exc
            finally:
                self.slots.release()

        self.pool.submit(run)

    def close(self, raise_error: bool = True) -> None:
        self.pool.shutdown(wait=True)
        if raise_error and self.error is not None:
            raise self.error


class _Sink:
    """Queues one object's chunks for the writer; the last byte written triggers `finish`."""

    def __init__(self, i, files, remaining, lock, on_bytes, finish, writer):
        self.i, self.files, self.remaining, self.lock = i, files, remaining, lock
        self.on_bytes, self.finish, self.writer = on_bytes, finish, writer

    def __call__(self, pos: int, chunk: memoryview) -> None:
        self.writer.submit(self._write, pos, chunk)

    def _write(self, pos: int, chunk: memoryview) -> None:
        fd, size = self.files.fd(self.i), len(chunk)
        while len(chunk):
            n = os.pwrite(fd, chunk, pos)
            chunk, pos = chunk[n:], pos + n
        if self.on_bytes is not None:
            self.on_bytes(size)
        with self.lock:
            self.remaining[self.i] -= size
            done = self.remaining[self.i] == 0
        if done:
            self.finish(self.i)


def _allocate(fd: int, size: int, path: Path) -> None:
    """Reserve the whole file now: a full disk fails here, before any byte is fetched."""
    if size <= 0:
        return
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno in (95, 22):  # EOPNOTSUPP / EINVAL: a filesystem without fallocate
            os.ftruncate(fd, size)
        else:
            raise OSError(exc.errno, f"cannot allocate {size} bytes for {path}: {exc.strerror}") from None
