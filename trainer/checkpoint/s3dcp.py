"""The DCP storage writer and reader for `s3://` checkpoints (imports torch and s3torchconnector).

`trainer.checkpoint.s3io` is the entry point (`storage_writer`, `storage_reader`); it imports this
module on the first S3 writer/reader, so that importing `s3io` stays torch-free. The classes build
on s3torchconnector's public DCP API (`S3StorageWriter`, `S3StorageReader`, `S3FileSystem`,
`S3ClientConfig`) and `aerie_s3.ranged` for restores; how data moves is in `s3io`'s docstring.

Private APIs that remain (checked against s3torchconnector 1.5.0):
- `s3torchconnector._s3client.S3Client`: the only way to give `S3FileSystem` a CRT client bound to
  an endpoint (`S3ClientConfig` has no endpoint field, and the public writer/reader build their
  file system without one). Needed for every non-AWS endpoint (the dev stack's, the tests').
- `S3StorageReader._reader_constructor`: the parent's reader constructor, handed on to the file
  system we swap in so that the parent's `prepare_local_plan` still injects ranges into it.
"""

from __future__ import annotations

import bisect
import contextlib
import copy
import dataclasses
import io
from concurrent.futures import ThreadPoolExecutor

from s3torchconnector import S3ClientConfig
from s3torchconnector._s3client import S3Client  # private: the only client with an endpoint (docstring)
from s3torchconnector.dcp import S3FileSystem, S3StorageReader, S3StorageWriter
from torch.distributed.checkpoint import FileSystemReader
from torch.futures import Future

from aerie_s3.ranged import buffer_sink, coalesce, fetch_ranges
from aerie_s3.settings import MiB, S3Settings, parse_uri


def _crt_config(settings: S3Settings):
    return S3ClientConfig(
        throughput_target_gbps=settings.throughput_target_gbps,
        part_size=settings.part_size,
        force_path_style=settings.path_style,
        max_attempts=settings.max_attempts,
    )


def crt_client(settings: S3Settings | None = None) -> S3Client:
    """s3torchconnector's CRT client bound to the configured endpoint (the private API, see above)."""
    settings = settings or S3Settings.from_env()
    return S3Client(settings.region, endpoint=settings.endpoint_url, s3client_config=_crt_config(settings))


class AerieS3StorageWriter(S3StorageWriter):
    """s3torchconnector's DCP writer on our endpoint: the parent sets up as usual, then its file
    system is swapped for one whose CRT client has the configured endpoint (1.5.0 builds its own
    without one; only `AWS_ENDPOINT_URL` would reach it). Everything else is the parent's."""

    def __init__(self, path: str, settings: S3Settings, thread_count: int = 8, **kwargs):
        cfg = _crt_config(settings)
        super().__init__(settings.region, path, s3client_config=cfg, thread_count=thread_count, **kwargs)
        self.fs = S3FileSystem(settings.region, s3_client=crt_client(settings))
        self.path = self.fs.init_path(path)


class AerieS3StorageReader(S3StorageReader):
    """Restores with `connections` ranged GETs in flight, all the same size.

    The parent reads one file after another; reading files in parallel still left
    connections idle, measured through the throttling proxy: the CRT fetches the first
    part of each object alone (to learn its size) before fanning out, and each file
    ends with a tail of one or two parts. Here the byte ranges this rank needs (items
    of a file, coalesced across gaps below a read part) are cut into equal slices of
    at most `read_part_size`, fetched through the CRT by `aerie_s3.ranged` into
    memory, then deserialised by the parent's code. At
    most about `buffer_bytes` are held at once; the next batch downloads while the
    previous one is deserialised.
    """

    def __init__(self, path: str, settings: S3Settings, connections: int = 16, buffer_bytes: int = 1 << 30, **kwargs):
        cfg = _crt_config(settings)
        super().__init__(settings.region, path, s3client_config=cfg, **kwargs)
        # Parts as large as a slice: each slice is then exactly one GET, so `connections`
        # is what is in flight (the CRT would split a larger range over its own pool).
        self.part_size = settings.read_part_size
        crt_part = max(self.part_size, 5 * MiB)  # the CRT refuses smaller parts, even for GETs
        self.crt = crt_client(dataclasses.replace(settings, part_size=crt_part))
        # The parent's (private) reader constructor: its prepare_local_plan injects ranges into this one.
        self.fs = S3FileSystem(settings.region, s3_client=self.crt, reader_constructor=self._reader_constructor)
        self.path = self.fs.init_path(path)
        self.settings = settings
        self.connections = max(1, connections)
        self.buffer_bytes = buffer_bytes

    def read_data(self, plan, planner):
        per_file: dict[str, list] = {}
        for item in plan.items:
            per_file.setdefault(self.storage_data[item.storage_index].relative_path, []).append(item)
        batches, batch, size = [], [], 0
        for rel, items in per_file.items():
            spans = coalesce(
                [(self.storage_data[i.storage_index].offset, self.storage_data[i.storage_index].length) for i in items],
                self.part_size,
            )
            batch.append((rel, items, spans))
            size += sum(hi - lo for lo, hi in spans)
            if size >= self.buffer_bytes:
                batches.append(batch)
                batch, size = [], 0
        if batch:
            batches.append(batch)
        # One batch downloads (its own `connections` GETs) while the previous one is parsed.
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="s3-batch") as pool:
            pending = self._fetch(pool, batches[0]) if batches else None
            for i, batch in enumerate(batches):
                windows = pending()
                if i + 1 < len(batches):
                    pending = self._fetch(pool, batches[i + 1])  # downloads while this one is parsed
                view = copy.copy(self)  # the parent's read_data, on files already in memory
                view.fs = _MemoryFiles(windows)
                sub_plan = dataclasses.replace(plan, items=[item for _, items, _ in batch for item in items])
                FileSystemReader.read_data(view, sub_plan, planner)
        done = Future()
        done.set_result(None)
        return done

    def _fetch(self, pool, batch):
        """Start fetching every span of `batch` (through `aerie_s3.ranged`, on a thread of
        `pool`); returns a function that waits for {relative_path: [(start, buffer)]}."""
        windows = {rel: [(lo, bytearray(hi - lo)) for lo, hi in spans] for rel, _, spans in batch}
        bucket, prefix = parse_uri(str(self.path))
        ranges = [
            (bucket, f"{prefix.rstrip('/')}/{rel}", lo, lo + len(buf), buffer_sink(buf, lo))
            for rel, spans in windows.items()
            for lo, buf in spans
        ]
        future = pool.submit(
            fetch_ranges,
            ranges,
            settings=self.settings,
            connections=self.connections,
            max_part=self.part_size,
        )

        def wait():
            future.result()
            return windows

        return wait


class _MemoryFiles:
    """The slice of a DCP file system the parent's `read_data` uses, serving bytes fetched
    already: {relative path: [(start offset, buffer)]}."""

    def __init__(self, windows: dict[str, list[tuple[int, bytearray]]]):
        self.windows = windows

    def concat_path(self, path, suffix: str) -> str:
        return suffix

    @contextlib.contextmanager
    def create_stream(self, path: str, mode: str):
        assert mode == "rb", mode
        yield _WindowsReader(self.windows[path])


class _WindowsReader(io.RawIOBase):
    """A read-only, seekable file over the fetched spans of one object (offsets are the
    object's). DCP seeks to an item and reads within it, so a read never crosses spans."""

    def __init__(self, windows: list[tuple[int, bytearray]]):
        super().__init__()
        self.starts = [lo for lo, _ in windows]
        self.views = [memoryview(buf) for _, buf in windows]
        self.pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        end = self.starts[-1] + len(self.views[-1])
        self.pos = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: end}[whence] + offset
        return self.pos

    def readinto(self, b) -> int:
        i = bisect.bisect_right(self.starts, self.pos) - 1
        if i < 0:
            raise OSError(f"offset {self.pos} was not fetched")
        view = self.views[i][self.pos - self.starts[i] :]
        n = min(len(b), len(view))
        memoryview(b).cast("B")[:n] = view[:n]
        self.pos += n
        return n
