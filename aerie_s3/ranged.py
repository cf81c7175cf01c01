"""The parallel ranged-GET engine: byte ranges of one or many objects, `connections` CRT GETs at once.

Why equal slices: S3 caps each connection (~80-100 MB/s), so throughput is the number of busy
connections. Measured through the throttling proxy (bench/checkpoint.py), fetching object after
object, or letting the CRT split each object itself, left connections idle: the CRT fetches the
first part of an object alone before fanning out, and every object ends on a tail of one or two
parts. So the ranges a caller needs are cut into a multiple of `connections` equal slices (none
over the read part size, none under 256 KiB), each slice one GET, all `connections` of them busy
to the end. A slice may cross objects (many small objects) and an object may span many slices.

Where the bytes go is the caller's: a `sink(position, chunk)` per range, e.g. a slice of one
preallocated buffer (`parallel_get`, checkpoint restores, FastFile reads) or `os.pwrite` into a
file (channel downloads). Torch-free.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from typing import Any, TypeVar

from aerie_s3.clients import boto3_client, crt_client
from aerie_s3.settings import S3Settings, parse_uri

T = TypeVar("T", bound=Hashable)
MIN_SLICE = 256 * 1024
Sink = Callable[[int, memoryview], None]


class Cancelled(Exception):
    """The caller asked the transfer to stop (a stop request while a channel downloads)."""


def coalesce(ranges: list[tuple[int, int]], max_gap: int) -> list[tuple[int, int]]:
    """(offset, length) items -> sorted [start, end) spans, merged across gaps up to `max_gap`
    (a gap that small costs less than another round trip)."""
    spans: list[list[int]] = []
    for offset, length in sorted(ranges):
        if spans and offset - spans[-1][1] <= max_gap:
            spans[-1][1] = max(spans[-1][1], offset + length)
        else:
            spans.append([offset, offset + length])
    return [(lo, hi) for lo, hi in spans]


def slice_size(total: int, connections: int, max_part: int, floor: int = MIN_SLICE) -> int:
    """A multiple of `connections` equal slices, none larger than `max_part`: every connection
    stays busy to the end (an odd last round would leave most of them idle)."""
    connections = max(1, connections)
    rounds = max(1, -(-total // (connections * max_part)))
    return max(-(-total // (connections * rounds)), floor)


def equal_slices(
    pieces: Sequence[tuple[T, int, int]], connections: int, max_part: int
) -> list[list[tuple[T, int, int]]]:
    """(tag, start, end) ranges -> tasks of about one slice each; a task is a list of
    (tag, start, end) sub-ranges fetched one after the other by one connection.

    Slices are at least 256 KiB, so one object is never cut into tiny GETs, unless there are at
    least `connections` ranges (many small objects or FastFile samples): they are then spread
    over every connection however small they are."""
    total = sum(end - start for _, start, end in pieces)
    if total <= 0:
        return []
    many = sum(1 for _, start, end in pieces if end > start) >= connections
    size = slice_size(total, connections, max_part, floor=1 if many else MIN_SLICE)
    tasks: list[list[tuple[T, int, int]]] = []
    current: list[tuple[T, int, int]] = []
    room = size
    for tag, start, end in pieces:
        pos = start
        while pos < end:
            n = min(room, end - pos)
            current.append((tag, pos, pos + n))
            pos, room = pos + n, room - n
            if room == 0:
                tasks.append(current)
                current, room = [], size
    if current:
        tasks.append(current)
    return tasks


def read_range(
    client: Any,
    bucket: str,
    key: str,
    start: int,
    end: int,
    sink: Sink,
    stop: threading.Event | None = None,
) -> None:
    """GET bytes [start, end) of one object through the CRT, handing each chunk to `sink`."""
    pos = start
    for chunk in client.get_object(bucket, key, start, end):
        view = memoryview(chunk)[: end - pos]
        if len(view):
            sink(pos, view)
            pos += len(view)
        if stop is not None and stop.is_set():
            raise Cancelled(f"s3://{bucket}/{key}")
    if pos != end:
        raise OSError(f"short read of s3://{bucket}/{key}: got up to byte {pos} of [{start}, {end})")


def run_tasks(tasks: Sequence[Any], fn: Callable[[Any], None], workers: int, stop: threading.Event | None = None):
    """Run `fn(task)` for every task on `workers` threads. The first error (or `stop` being set)
    stops the rest: tasks not started are dropped, running ones end at their next chunk."""
    stop = stop if stop is not None else threading.Event()

    def guarded(task):
        if stop.is_set():
            raise Cancelled("stopped")
        fn(task)

    with ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="s3-get") as pool:
        futures = [pool.submit(guarded, t) for t in tasks]
        done, _ = wait(futures, return_when=FIRST_EXCEPTION)
        failed = next((f for f in done if f.exception() is not None), None)
        if failed is not None:
            stop.set()
            for f in futures:
                f.cancel()
            wait(futures)
            # The first real error, not a Cancelled it caused in other threads.
            errors = [f.exception() for f in futures if not f.cancelled() and f.exception() is not None]
            real = [e for e in errors if not isinstance(e, Cancelled)]
            raise (real or errors)[0]


def fetch_ranges(
    ranges: Sequence[tuple[str, str, int, int, Sink]],
    *,
    settings: S3Settings | None = None,
    connections: int | None = None,
    max_part: int | None = None,
    stop: threading.Event | None = None,
) -> None:
    """Fetch every (bucket, key, start, end, sink) range with `connections` GETs in flight."""
    settings = settings or S3Settings.from_env()
    connections = connections or settings.connections
    max_part = max_part or settings.read_part_size
    pieces = [(i, start, end) for i, (_, _, start, end, _) in enumerate(ranges) if end > start]
    tasks = equal_slices(pieces, connections, max_part)
    if not tasks:
        return
    # One client per part size: slices never exceed its part, so each slice is exactly one GET.
    client = crt_client(settings, part_size=max(max_part, settings.read_part_size), connections=connections)

    def run(task):
        for i, start, end in task:
            bucket, key, _, _, sink = ranges[i]
            read_range(client, bucket, key, start, end, sink, stop)

    run_tasks(tasks, run, connections, stop)


def buffer_sink(buf: bytearray | memoryview, base: int = 0) -> Sink:
    """A sink writing object offsets [base, base + len(buf)) into `buf`."""
    view = memoryview(buf)

    def sink(pos: int, chunk: memoryview) -> None:
        view[pos - base : pos - base + len(chunk)] = chunk

    return sink


def parallel_get(
    uri: str,
    *,
    connections: int | None = None,
    part_size: int | None = None,
    settings: S3Settings | None = None,
) -> bytearray:
    """Read a whole object into one preallocated buffer with `connections` ranged GETs at once
    (no temp file, no second copy)."""
    settings = settings or S3Settings.from_env()
    bucket, key = parse_uri(uri)
    size = boto3_client(settings).head_object(Bucket=bucket, Key=key)["ContentLength"]
    buf = bytearray(size)
    fetch_ranges(
        [(bucket, key, 0, size, buffer_sink(buf))],
        settings=settings,
        connections=connections,
        max_part=part_size or settings.read_part_size,
    )
    return buf
