"""FastFile: a Megatron indexed dataset read straight from S3, no file on local disk.

The `.idx` is read once (parallel ranged GETs into memory: about 20 bytes per sequence); token
bytes of the `.bin` come from memory held by a read-ahead (`trainer.data.readahead`), which knows
from the sampler's order which byte ranges the next micro-batches need and fetches them with the
same CRT ranged-GET engine as channel downloads and checkpoint restores (`aerie_s3.ranged`). A read
the read-ahead did not foresee (e.g. a dataset used without it) is fetched on the spot, and counted
in `misses`. Numpy only, like the rest of `trainer.data`.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Hashable, Sequence

import numpy as np

from aerie_s3.clients import boto3_client
from aerie_s3.ranged import buffer_sink, fetch_ranges, parallel_get
from aerie_s3.settings import S3Settings, parse_uri
from trainer.data.indexed import _Sequences, bin_path, idx_path, parse_index


class SpanStore:
    """Byte spans of one object held in memory, each batch under the token of whoever fetched it
    (a read-ahead window), until that token is dropped."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[Hashable, list[tuple[int, bytearray]]] = {}
        self._starts: list[int] = []
        self._spans: list[tuple[int, int, bytearray]] = []
        self._reach: list[int] = []  # the largest end among spans[0..i]: where a backward search stops

    def add(self, token: Hashable, windows: list[tuple[int, bytearray]]) -> None:
        with self._lock:
            self._held[token] = windows
            self._reindex()

    def drop(self, token: Hashable) -> None:
        with self._lock:
            if self._held.pop(token, None) is not None:
                self._reindex()

    def _reindex(self) -> None:
        spans = sorted(
            ((lo, lo + len(buf), buf) for windows in self._held.values() for lo, buf in windows), key=lambda s: s[:2]
        )
        self._spans = spans
        self._starts = [lo for lo, _, _ in spans]
        self._reach, reach = [], -1
        for _, hi, _ in spans:
            reach = max(reach, hi)
            self._reach.append(reach)

    def read(self, start: int, end: int) -> memoryview | None:
        """Bytes [start, end) if one held span covers them, else None."""
        with self._lock:
            i = bisect.bisect_right(self._starts, start) - 1
            while i >= 0 and self._reach[i] >= end:
                lo, hi, buf = self._spans[i]
                if end <= hi:  # lo <= start: every span up to i starts at or before it
                    return memoryview(buf)[start - lo : end - lo]
                i -= 1
            return None

    @property
    def held_bytes(self) -> int:
        with self._lock:
            return sum(hi - lo for lo, hi, _ in self._spans)


class S3IndexedDataset(_Sequences):
    """`s3://bucket/prefix.bin` / `.idx` as an indexed dataset (same items as IndexedDataset)."""

    streaming = True

    def __init__(self, path_prefix: str, settings: S3Settings | None = None) -> None:
        self.path_prefix = str(path_prefix)
        self.settings = settings or S3Settings.from_env()
        ipath, bpath = idx_path(path_prefix), bin_path(path_prefix)
        self.bucket, self.bin_key = parse_uri(bpath)
        client = boto3_client(self.settings)
        try:
            self.bin_size = int(client.head_object(Bucket=self.bucket, Key=self.bin_key)["ContentLength"])
            self._index = parallel_get(ipath, settings=self.settings)
        except Exception as exc:
            code = (getattr(exc, "response", None) or {}).get("Error", {}).get("Code")
            if code in ("404", "NoSuchKey", "NotFound", "NoSuchBucket"):
                raise FileNotFoundError(f"indexed dataset file not found: {ipath} / {bpath} ({code})") from None
            raise
        self.dtype, self.sequence_lengths, self.sequence_pointers, self.document_indices = parse_index(
            self._index, ipath
        )
        self._itemsize = np.dtype(self.dtype).itemsize
        self.store = SpanStore()
        self.misses = 0  # reads fetched on the spot (no read-ahead held them)

    def __getstate__(self) -> dict:
        return {"path_prefix": self.path_prefix}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["path_prefix"])

    def fetch(self, spans: Sequence[tuple[int, int]], connections: int | None = None) -> list[tuple[int, bytearray]]:
        """[start, end) spans of the .bin into fresh buffers, `connections` ranged GETs at once."""
        windows = [(lo, bytearray(hi - lo)) for lo, hi in spans]
        fetch_ranges(
            [(self.bucket, self.bin_key, lo, lo + len(buf), buffer_sink(buf, lo)) for lo, buf in windows],
            settings=self.settings,
            connections=connections,
        )
        return windows

    def get(self, idx: int, offset: int = 0, length: int | None = None) -> np.ndarray:
        start, end = self.byte_range(idx, offset, length)
        view = self.store.read(start, end)
        if view is None:
            self.misses += 1
            ((_, buf),) = self.fetch([(start, end)], connections=1)
            view = memoryview(buf)
        return np.frombuffer(view, self.dtype, (end - start) // self._itemsize)

    @staticmethod
    def exists(path_prefix: str, settings: S3Settings | None = None) -> bool:
        bucket, key = parse_uri(idx_path(path_prefix))
        try:
            boto3_client(settings).head_object(Bucket=bucket, Key=key)
        except Exception:
            return False
        return True


def open_indexed(path_prefix: str):
    """The reader for a prefix: S3 (streamed) for `s3://`, else the memory-mapped file."""
    if str(path_prefix).startswith("s3://"):
        return S3IndexedDataset(str(path_prefix))
    from trainer.data.indexed import IndexedDataset

    return IndexedDataset(path_prefix)
