"""A file-like object whose bytes stream to S3 as a parallel multipart upload.

Written for `aerie data preprocess --output-prefix s3://...`: the tokenizer's output goes straight
to the bucket, nothing staged on disk, so raw JSONL becomes a training dataset without a shared
filesystem. The upload is boto3's own transfer manager (`upload_fileobj` reading a non-seekable
stream: parts of `part_size` uploaded `concurrency` at a time, each with its CRC32), fed through
a bounded queue from the writer's thread. `close()` completes the upload and raises its error if
it failed; `abort()` (or leaving a `with` block on an exception) cancels it: the multipart upload
is aborted and no object appears.
"""

from __future__ import annotations

import io
import queue
import threading

from aerie_s3.clients import boto3_client
from aerie_s3.settings import S3Settings, parse_uri

_EOF = object()


class _Aborted(Exception):
    pass


class _QueueReader(io.RawIOBase):
    """The upload's side: `read(n)` from the chunks the writer queued."""

    def __init__(self, q: queue.Queue):
        super().__init__()
        self.q = q
        self.pending = memoryview(b"")
        self.eof = False

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        out = bytearray()
        while (n < 0 or len(out) < n) and not self.eof:
            if not self.pending:
                item = self.q.get()
                if item is _EOF:
                    self.eof = True
                    break
                if isinstance(item, BaseException):
                    raise item
                self.pending = memoryview(item)
            take = len(self.pending) if n < 0 else min(n - len(out), len(self.pending))
            out += self.pending[:take]
            self.pending = self.pending[take:]
        return bytes(out)


class StreamingUpload(io.RawIOBase):
    """`with StreamingUpload("s3://b/k") as f: f.write(...)` uploads k once the block ends cleanly."""

    def __init__(
        self,
        uri: str,
        settings: S3Settings | None = None,
        part_size: int | None = None,
        concurrency: int = 8,
    ):
        super().__init__()
        from boto3.s3.transfer import TransferConfig

        self.uri = uri
        self.settings = settings or S3Settings.from_env()
        self.bucket, self.key = parse_uri(uri)
        part = max(part_size or self.settings.part_size, 5 * 1024 * 1024)
        self.config = TransferConfig(
            multipart_threshold=part, multipart_chunksize=part, max_concurrency=concurrency, use_threads=True
        )
        # A few parts' worth of chunks in flight between writer and uploader, no more.
        self.q: queue.Queue = queue.Queue(maxsize=64)
        self.buffer = bytearray()
        self.chunk = 1024 * 1024
        self.error: BaseException | None = None
        self.bytes_written = 0
        self._finished = False
        client = boto3_client(self.settings, max_pool_connections=max(concurrency, 10))
        self.thread = threading.Thread(target=self._upload, args=(client,), name="s3-upload", daemon=True)
        self.thread.start()

    def _upload(self, client) -> None:
        try:
            client.upload_fileobj(_QueueReader(self.q), self.bucket, self.key, Config=self.config)
        except BaseException as exc:  # reported by close()
            self.error = exc
            # Drain so a blocked writer wakes up and sees the error.
            while True:
                try:
                    self.q.get_nowait()
                except queue.Empty:
                    break

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        if self.error is not None:
            raise OSError(f"upload to {self.uri} failed: {self.error}")
        if self._finished:
            raise ValueError(f"write to {self.uri} after close")
        self.buffer += data
        if len(self.buffer) >= self.chunk:
            self._put(bytes(self.buffer))
            self.buffer.clear()
        n = len(memoryview(data).cast("B"))
        self.bytes_written += n
        return n

    def _put(self, item) -> None:
        while self.thread.is_alive():
            try:
                self.q.put(item, timeout=0.5)
                return
            except queue.Full:
                continue
        if self.error is not None:
            raise OSError(f"upload to {self.uri} failed: {self.error}")

    def close(self) -> None:
        """Complete the upload (the object appears now); raise if it failed."""
        if self._finished:
            return super().close()
        self._finished = True
        if self.buffer:
            self._put(bytes(self.buffer))
            self.buffer.clear()
        self._put(_EOF)
        self.thread.join()
        super().close()
        if self.error is not None:
            raise OSError(f"upload to {self.uri} failed: {self.error}") from self.error

    def abort(self) -> None:
        """Cancel: the multipart upload is aborted and no object appears."""
        if self._finished:
            return
        self._finished = True
        self._put(_Aborted(f"upload of {self.uri} aborted"))
        self.thread.join()
        super().close()

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.abort()
        else:
            self.close()


def upload_files(
    pairs: list[tuple[str, str]],
    settings: S3Settings | None = None,
    connections: int | None = None,
    part_size: int = 16 << 20,
) -> int:
    """Upload local files to S3 URIs in parallel: `connections` transfers in flight, files and the
    parts of large ones alike (boto3's multipart transfer manager, a CRC32 per part). Each file's
    size is checked again after its upload: a file that changed meanwhile raises (the caller's
    checkpoint was still being written). Returns the bytes uploaded; raises the first error."""
    import os
    from concurrent.futures import ThreadPoolExecutor

    from boto3.s3.transfer import TransferConfig

    settings = settings or S3Settings.from_env()
    connections = connections or settings.connections
    client = boto3_client(settings, max_pool_connections=max(connections * 2, 10))
    per_file = max(1, connections // max(1, min(len(pairs), connections)))
    config = TransferConfig(multipart_threshold=part_size, multipart_chunksize=part_size, max_concurrency=per_file)

    def one(pair: tuple[str, str]) -> int:
        path, uri = pair
        before = os.stat(path)
        bucket, key = parse_uri(uri)
        client.upload_file(path, bucket, key, Config=config)
        after = os.stat(path)
        if (after.st_size, after.st_mtime_ns) != (before.st_size, before.st_mtime_ns):
            raise RuntimeError(f"{path} changed while it was uploaded")
        return before.st_size

    with ThreadPoolExecutor(max_workers=max(1, min(connections, len(pairs)))) as pool:
        return sum(pool.map(one, pairs))
