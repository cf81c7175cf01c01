"""S3 clients for checkpoints: boto3 for control calls, AWS CRT (s3torchconnector) for data.

Two halves:

- torch-free (importable by the control plane and Lambda handlers): `S3Settings`,
  `parse_uri`, `boto3_client` (list/head/delete/abort multipart), `parallel_get`.
- torch (imports s3torchconnector lazily): `crt_client`, `storage_writer`,
  `storage_reader` for `torch.distributed.checkpoint`.

Settings come from the environment: `AERIE_S3_ENDPOINT` (else `AWS_ENDPOINT_URL`),
`AWS_REGION` (else `AWS_DEFAULT_REGION`, else us-east-1), the usual AWS credential
variables (or boto3's/CRT's default chain), `AERIE_S3_PART_SIZE` (bytes, default 8 MiB),
`AERIE_S3_READ_PART_SIZE` (largest ranged GET of a restore, default 16 MiB),
`AERIE_S3_THROUGHPUT_GBPS` (CRT's target, default 10) and `AERIE_S3_MAX_ATTEMPTS`.
A non-AWS endpoint (the loopback moto server) gets path-style addressing.

How data moves (checked against s3torchconnector 1.5.0 and torch 2.13):

- Saves: DCP's writer serialises each rank's items into `thread_count` files at once; every
  file is a streaming multipart upload through the CRT (`S3Writer`), parts of `part_size`
  go out in parallel as they fill. Nothing is staged on local disk.
- Restores: s3torchconnector's reader fetches each file as one coalesced range; the CRT
  GETs part 0 of each object alone before fanning out, and each file ends on a tail of its
  last parts, which through the throttling proxy kept a restore near half of (peak
  connections x cap). Our reader subclass cuts the byte ranges a rank needs into equal
  slices of at most `read_part_size`, keeps `connections` CRT ranged GETs in flight into
  memory (bounded), and lets the parent deserialise from there.
  `parallel_get` is the same idea for one whole object outside DCP (e.g. a `torch.save`
  file), with boto3 ranged GETs into one preallocated buffer.
"""

from __future__ import annotations

import bisect
import contextlib
import copy
import dataclasses
import functools
import io
import os
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

MiB = 1024 * 1024


@dataclass(frozen=True)
class S3Settings:
    endpoint_url: str | None = None
    region: str = "us-east-1"
    access_key_id: str | None = None
    secret_access_key: str | None = None
    session_token: str | None = None
    part_size: int = 8 * MiB
    read_part_size: int = 16 * MiB  # one ranged GET of a restore; reads have no 5 MiB floor
    throughput_target_gbps: float = 10.0
    max_attempts: int = 10

    @classmethod
    def from_env(cls, env: "os._Environ[str] | dict[str, str] | None" = None) -> "S3Settings":
        env = os.environ if env is None else env
        return cls(
            endpoint_url=env.get("AERIE_S3_ENDPOINT") or env.get("AWS_ENDPOINT_URL") or None,
            region=env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or "us-east-1",
            access_key_id=env.get("AWS_ACCESS_KEY_ID") or None,
            secret_access_key=env.get("AWS_SECRET_ACCESS_KEY") or None,
            session_token=env.get("AWS_SESSION_TOKEN") or None,
            part_size=int(env.get("AERIE_S3_PART_SIZE") or 8 * MiB),
            read_part_size=int(env.get("AERIE_S3_READ_PART_SIZE") or 16 * MiB),
            throughput_target_gbps=float(env.get("AERIE_S3_THROUGHPUT_GBPS") or 10.0),
            max_attempts=int(env.get("AERIE_S3_MAX_ATTEMPTS") or 10),
        )

    @property
    def path_style(self) -> bool:
        """Virtual-hosted buckets only resolve on AWS itself."""
        if not self.endpoint_url:
            return False
        host = urllib.parse.urlparse(self.endpoint_url).hostname or ""
        return not host.endswith("amazonaws.com")


def parse_uri(uri: str) -> tuple[str, str]:
    """`s3://bucket/key/prefix` -> ("bucket", "key/prefix")."""
    parsed = urllib.parse.urlparse(uri)
    if parsed.scheme != "s3" or not parsed.netloc:
        raise ValueError(f"not an s3:// URI: {uri!r}")
    return parsed.netloc, parsed.path.lstrip("/")


def is_s3(uri: str | os.PathLike) -> bool:
    return str(uri).startswith("s3://")


# --- boto3 half (torch-free) ------------------------------------------------------------


@functools.lru_cache(maxsize=8)
def _boto3_client(settings: S3Settings, max_pool_connections: int):
    import boto3
    from botocore.config import Config

    config = Config(
        region_name=settings.region,
        retries={"max_attempts": settings.max_attempts, "mode": "standard"},
        max_pool_connections=max_pool_connections,
        s3={"addressing_style": "path" if settings.path_style else "auto"},
    )
    return boto3.session.Session().client(
        "s3",
        endpoint_url=settings.endpoint_url,
        aws_access_key_id=settings.access_key_id,
        aws_secret_access_key=settings.secret_access_key,
        aws_session_token=settings.session_token,
        config=config,
    )


def boto3_client(settings: S3Settings | None = None, max_pool_connections: int = 32):
    """A boto3 S3 client for control calls (clients are thread-safe; cached per settings)."""
    return _boto3_client(settings or S3Settings.from_env(), max_pool_connections)


def parallel_get(
    uri: str,
    *,
    connections: int = 16,
    part_size: int | None = None,
    settings: S3Settings | None = None,
) -> bytearray:
    """Read a whole object into memory with `connections` concurrent ranged GETs.

    Each part lands directly in its slice of one preallocated buffer: no temp files, no
    second copy. S3 caps each connection (~80-100 MB/s), so throughput scales with
    `connections` until the NIC is full.
    """
    settings = settings or S3Settings.from_env()
    part_size = part_size or settings.part_size
    client = boto3_client(settings, max_pool_connections=max(connections, 10))
    bucket, key = parse_uri(uri)
    size = client.head_object(Bucket=bucket, Key=key)["ContentLength"]
    # A multiple of `connections` equal parts, none larger than part_size: every connection
    # stays busy to the end (an odd last round would leave most of them idle).
    rounds = max(1, -(-size // (connections * part_size)))
    part_size = max(-(-size // (connections * rounds)), 256 * 1024)
    buf = bytearray(size)
    view = memoryview(buf)

    def fetch(start: int) -> None:
        end = min(start + part_size, size) - 1
        body = client.get_object(Bucket=bucket, Key=key, Range=f"bytes={start}-{end}")["Body"]
        pos = start
        while pos <= end:
            n = body.readinto(view[pos : end + 1]) if hasattr(body, "readinto") else None
            if n is None:  # botocore's StreamingBody has no readinto on old versions
                chunk = body.read(end + 1 - pos)
                n = len(chunk)
                view[pos : pos + n] = chunk
            if n == 0:
                raise IOError(f"short read of {uri} at {pos}")
            pos += n

    with ThreadPoolExecutor(max_workers=connections) as pool:
        list(pool.map(fetch, range(0, size, part_size)))
    return buf


# --- CRT / torch half (imports s3torchconnector lazily) ---------------------------------


def _crt_config(settings: S3Settings):
    from s3torchconnector import S3ClientConfig

    return S3ClientConfig(
        throughput_target_gbps=settings.throughput_target_gbps,
        part_size=settings.part_size,
        force_path_style=settings.path_style,
        max_attempts=settings.max_attempts,
    )


def crt_client(settings: S3Settings | None = None):
    """s3torchconnector's CRT client bound to the configured endpoint."""
    from s3torchconnector._s3client import S3Client

    settings = settings or S3Settings.from_env()
    return S3Client(settings.region, endpoint=settings.endpoint_url, s3client_config=_crt_config(settings))


@functools.cache
def _dcp_classes():
    """Subclasses of s3torchconnector's DCP writer/reader that honour our endpoint.

    In s3torchconnector 1.5.0 `S3StorageWriter/Reader` build their own `S3FileSystem`
    without an endpoint (only `AWS_ENDPOINT_URL` would reach it). These subclasses let
    the parent set up as usual, then swap in a file system whose CRT client has the
    configured endpoint; everything else is the parent's. Built on first use so that
    importing this module does not import torch.
    """
    from s3torchconnector.dcp import S3StorageReader, S3StorageWriter
    from s3torchconnector.dcp.s3_file_system import S3FileSystem
    from torch.distributed.checkpoint import FileSystemReader
    from torch.futures import Future

    class AerieS3StorageWriter(S3StorageWriter):
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
        at most `read_part_size`, fetched through the CRT (`S3Client._get_object_stream`,
        s3torchconnector 1.5.0) into memory, then deserialised by the parent's code. At
        most about `buffer_bytes` are held at once; the next batch downloads while the
        previous one is deserialised.
        """

        def __init__(self, path: str, settings: S3Settings, connections: int = 16,
                     buffer_bytes: int = 1 << 30, **kwargs):
            cfg = _crt_config(settings)
            super().__init__(settings.region, path, s3client_config=cfg, **kwargs)
            # Parts as large as a slice: each slice is then exactly one GET, so `connections`
            # is what is in flight (the CRT would split a larger range over its own pool).
            self.part_size = settings.read_part_size
            crt_part = max(self.part_size, 5 * MiB)  # the CRT refuses smaller parts, even for GETs
            self.crt = crt_client(dataclasses.replace(settings, part_size=crt_part))
            self.fs = S3FileSystem(settings.region, s3_client=self.crt, reader_constructor=self._reader_constructor)
            self.path = self.fs.init_path(path)
            self.connections = max(1, connections)
            self.buffer_bytes = buffer_bytes

        def read_data(self, plan, planner):
            per_file: dict[str, list] = {}
            for item in plan.items:
                per_file.setdefault(self.storage_data[item.storage_index].relative_path, []).append(item)
            batches, batch, size = [], [], 0
            for rel, items in per_file.items():
                spans = _coalesce([(self.storage_data[i.storage_index].offset,
                                    self.storage_data[i.storage_index].length) for i in items], self.part_size)
                batch.append((rel, items, spans))
                size += sum(hi - lo for lo, hi in spans)
                if size >= self.buffer_bytes:
                    batches.append(batch)
                    batch, size = [], 0
            if batch:
                batches.append(batch)
            with ThreadPoolExecutor(max_workers=self.connections, thread_name_prefix="s3-get") as pool:
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
            """Start fetching every span of `batch`; returns a function that waits for
            {relative_path: [(start, buffer)]}."""
            windows = {rel: [(lo, bytearray(hi - lo)) for lo, hi in spans] for rel, _, spans in batch}
            pieces = [(rel, lo, memoryview(buf)) for rel, spans in windows.items() for lo, buf in spans]
            total = sum(len(v) for _, _, v in pieces)
            # A multiple of `connections` equal slices, none over a part: every connection
            # stays busy to the end, like parallel_get.
            rounds = max(1, -(-total // (self.connections * self.part_size)))
            slice_size = max(-(-total // (self.connections * rounds)), 256 * 1024)
            tasks, current, room = [], [], slice_size
            for rel, lo, view in pieces:
                pos = 0
                while pos < len(view):
                    n = min(room, len(view) - pos)
                    current.append((rel, lo + pos, view[pos:pos + n]))
                    pos, room = pos + n, room - n
                    if room == 0:
                        tasks.append(current)
                        current, room = [], slice_size
            if current:
                tasks.append(current)
            bucket, prefix = parse_uri(str(self.path))
            futures = [pool.submit(self._get, bucket, prefix, task) for task in tasks]

            def wait():
                for f in futures:
                    f.result()
                return windows

            return wait

        def _get(self, bucket: str, prefix: str, task) -> None:
            for rel, start, dest in task:
                key = f"{prefix.rstrip('/')}/{rel}"
                pos = 0
                for chunk in self.crt._get_object_stream(bucket, key, start, start + len(dest)):
                    n = min(len(chunk), len(dest) - pos)
                    dest[pos:pos + n] = memoryview(chunk)[:n]
                    pos += n
                if pos != len(dest):
                    raise IOError(f"short read of s3://{bucket}/{key} at {start + pos}")

    return AerieS3StorageWriter, AerieS3StorageReader


def _coalesce(ranges: list[tuple[int, int]], max_gap: int) -> list[tuple[int, int]]:
    """(offset, length) items -> sorted [start, end) spans, merged across gaps up to `max_gap`
    (a gap that small costs less than another round trip)."""
    spans: list[list[int]] = []
    for offset, length in sorted(ranges):
        if spans and offset - spans[-1][1] <= max_gap:
            spans[-1][1] = max(spans[-1][1], offset + length)
        else:
            spans.append([offset, offset + length])
    return [(lo, hi) for lo, hi in spans]


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
            raise IOError(f"offset {self.pos} was not fetched")
        view = self.views[i][self.pos - self.starts[i]:]
        n = min(len(b), len(view))
        memoryview(b).cast("B")[:n] = view[:n]
        self.pos += n
        return n


def _local_path(uri: str | os.PathLike) -> str:
    text = str(uri)
    return urllib.parse.urlparse(text).path if text.startswith("file://") else text


def storage_writer(uri: str | os.PathLike, thread_count: int = 8, settings: S3Settings | None = None, **kwargs):
    """A DCP `StorageWriter` for `s3://` (streams to S3) or `file://`/a path."""
    if is_s3(uri):
        writer_cls, _ = _dcp_classes()
        return writer_cls(str(uri), settings or S3Settings.from_env(), thread_count=thread_count, **kwargs)
    from torch.distributed.checkpoint import FileSystemWriter

    return FileSystemWriter(_local_path(uri), thread_count=thread_count, **kwargs)


def storage_reader(
    uri: str | os.PathLike, connections: int = 16, settings: S3Settings | None = None, **kwargs
):
    """A DCP `StorageReader` for `s3://` (`connections` ranged GETs at once) or `file://`/a path."""
    if is_s3(uri):
        _, reader_cls = _dcp_classes()
        return reader_cls(str(uri), settings or S3Settings.from_env(), connections=connections, **kwargs)
    from torch.distributed.checkpoint import FileSystemReader

    return FileSystemReader(_local_path(uri), **kwargs)
