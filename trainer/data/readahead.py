"""Read-ahead for FastFile: fetch the bytes the next micro-batches need, in the sampler's order.

A streamed dataset (`S3IndexedDataset`) holds no token bytes. The sampler's order is known ahead
of time (the position in the data is just `consumed_samples`), so this iterator walks the sampler
ahead of the training loop: it groups the next micro-batches into chunks, merges each chunk's
byte ranges of the `.bin` (across gaps no larger than what they join: `merge`), and keeps
chunks worth `window_bytes` in flight through the CRT ranged-GET engine (`aerie_s3.ranged`), so
by the time the loop asks for a micro-batch its bytes are in memory. A chunk's buffers are released
once its micro-batches are built; memory stays near `window_bytes` per rank. The samples are
exactly those of the same dataset read from files: FastFile and File give bit-identical batches.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from aerie_s3.ranged import buffer_sink, fetch_ranges

MIN_GAP = 4096  # ranges this close are always one request
MAX_CHUNK_BATCHES = 256
DEFAULT_WINDOW = 64 * 1024 * 1024
_tokens = itertools.count()


def read_ahead(
    dataset, sampler: Iterable[list[int]], window_bytes: int = DEFAULT_WINDOW, connections: int | None = None
) -> Iterator[list[np.ndarray]]:
    """The samples of each micro-batch of `sampler`; fetched ahead when `dataset` streams."""
    if not getattr(dataset, "streaming", False):
        for indices in sampler:
            yield [dataset[i] for i in indices]
        return
    yield from _ReadAhead(dataset, sampler, window_bytes, connections)


class _ReadAhead:
    def __init__(self, dataset, sampler, window_bytes: int, connections: int | None):
        self.dataset = dataset
        self.batches = iter(sampler)
        self.window_bytes = max(int(window_bytes), 1)
        self.chunk_bytes = max(self.window_bytes // 4, 64 * 1024)
        self.connections = connections
        self.fetched_bytes = 0  # what went over the wire (merged spans), for the bench
        self.chunks = 0

    def _plan(self):
        """The next chunk: its micro-batches and, per streamed dataset, the merged spans to fetch."""
        group: list[list[int]] = []
        ranges: dict[object, list[tuple[int, int]]] = {}
        raw = 0
        for indices in self.batches:
            group.append(indices)
            for i in indices:
                for ds, lo, hi in self.dataset.byte_ranges(i):
                    if getattr(ds, "streaming", False):
                        ranges.setdefault(ds, []).append((lo, hi - lo))
                        raw += hi - lo
            if raw >= self.chunk_bytes or len(group) >= MAX_CHUNK_BATCHES:
                break
        return group, {ds: merge(r) for ds, r in ranges.items()}

    def _fetch(self, token, spans: dict) -> None:
        windows = {ds: [(lo, bytearray(hi - lo)) for lo, hi in s] for ds, s in spans.items()}
        first = next(iter(spans), None)
        if first is None:
            return
        fetch_ranges(
            [
                (ds.bucket, ds.bin_key, lo, lo + len(buf), buffer_sink(buf, lo))
                for ds, ws in windows.items()
                for lo, buf in ws
            ],
            settings=first.settings,
            connections=self.connections,
        )
        for ds, ws in windows.items():
            ds.store.add(token, ws)

    def __iter__(self) -> Iterator[list[np.ndarray]]:
        pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="read-ahead")
        pending: deque = deque()  # (micro-batches, token, future, bytes, datasets)
        exhausted = False
        try:
            while True:
                while not exhausted and sum(p[3] for p in pending) < self.window_bytes:
                    group, spans = self._plan()
                    if not group:
                        exhausted = True
                        break
                    token = ("read-ahead", next(_tokens))
                    size = sum(hi - lo for s in spans.values() for lo, hi in s)
                    self.fetched_bytes += size
                    self.chunks += 1
                    pending.append((group, token, pool.submit(self._fetch, token, spans), size, list(spans)))
                if not pending:
                    return
                group, token, future, _, datasets = pending.popleft()
                try:
                    future.result()
                    for indices in group:
                        yield [self.dataset[i] for i in indices]
                finally:
                    for ds in datasets:
                        ds.store.drop(token)
        finally:
            # Left early (a stop, an error): what is still being fetched is released when it lands.
            for _, token, future, _, datasets in pending:
                future.add_done_callback(lambda _f, token=token, datasets=datasets: _release(token, datasets))
            pool.shutdown(wait=False, cancel_futures=True)


def merge(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """(offset, length) -> sorted [start, end) spans, two joined when the gap between them is no
    larger than the next range (or MIN_GAP): one request instead of two, and never more than
    about twice the bytes needed (a gap bigger than what it joins would multiply the transfer
    when samples lie far apart in a large dataset)."""
    spans: list[list[int]] = []
    for offset, length in sorted(ranges):
        if spans and offset - spans[-1][1] <= max(MIN_GAP, length):
            spans[-1][1] = max(spans[-1][1], offset + length)
        else:
            spans.append([offset, offset + length])
    return [(lo, hi) for lo, hi in spans]


def _release(token, datasets) -> None:
    for ds in datasets:
        ds.store.drop(token)
