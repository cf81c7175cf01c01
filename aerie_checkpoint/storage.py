"""Where checkpoint objects live: S3 and file stores behind one small interface, URIs, ETags.

`open_store(uri)` gives the few operations the manifest and GC need (list, stat, read, write,
delete, a checksum to record, a deep re-check) for `s3://bucket/prefix` (boto3 through
`aerie_s3`) and for local paths or `file://` URIs. On S3 the checksum is the ETag from the
listing (no data is re-read at commit); a deep check re-reads the object and recomputes the ETag
(MD5, or the multipart MD5-of-part-MD5s). On files it is a streamed sha256.

Torch-free and standard library plus boto3: it ships to AWS Lambda with `manifest` and `gc`.
"""

from __future__ import annotations

import hashlib
import os
import re
import urllib.parse
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from aerie_s3.clients import boto3_client
from aerie_s3.settings import is_s3, parse_uri

__all__ = ["FileStore", "ObjectStat", "S3Store", "etag_of", "is_s3", "join_uri", "local_path", "open_store"]

_CHUNK = 8 * 1024 * 1024


def local_path(uri: str | os.PathLike[str]) -> str:
    """The filesystem path of a `file://` URI or a plain path."""
    text = str(uri)
    return urllib.parse.urlparse(text).path if text.startswith("file://") else text


def join_uri(base: str | os.PathLike[str], name: str) -> str:
    return f"{str(base).rstrip('/')}/{name}"


@dataclass(frozen=True)
class ObjectStat:
    size: int
    etag: str | None = None


class S3Store:
    def __init__(self, uri: str):
        self.bucket, key = parse_uri(uri)
        self.root = key.rstrip("/")
        self.client = boto3_client()

    def _key(self, rel: str) -> str:
        return f"{self.root}/{rel}" if self.root else rel

    def list(self, rel: str = "") -> dict[str, ObjectStat]:
        """All objects under `rel` (recursively), keyed by path relative to the root."""
        prefix = self._key(rel).rstrip("/") + "/" if (self.root or rel) else ""
        out: dict[str, ObjectStat] = {}
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
            for obj in page.get("Contents", []):
                rel_key = obj["Key"][len(self.root) + 1 :] if self.root else obj["Key"]
                out[rel_key] = ObjectStat(obj["Size"], obj.get("ETag", "").strip('"') or None)
        return out

    def stat(self, rel: str) -> ObjectStat | None:
        try:
            head = self.client.head_object(Bucket=self.bucket, Key=self._key(rel))
        except self.client.exceptions.ClientError as e:
            if e.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return None
            raise
        return ObjectStat(head["ContentLength"], head.get("ETag", "").strip('"') or None)

    def read(self, rel: str) -> bytes | None:
        try:
            return cast(bytes, self.client.get_object(Bucket=self.bucket, Key=self._key(rel))["Body"].read())
        except self.client.exceptions.NoSuchKey:
            return None

    def write(self, rel: str, data: bytes) -> None:
        self.client.put_object(Bucket=self.bucket, Key=self._key(rel), Body=data)

    def delete(self, rels: Iterable[str]) -> None:
        keys = [{"Key": self._key(r)} for r in rels]
        if not keys:
            return
        for i in range(0, len(keys), 1000):
            self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": keys[i : i + 1000], "Quiet": True})

    def checksum(self, rel: str, stat: ObjectStat) -> dict[str, Any]:
        return {"etag": stat.etag} if stat.etag else {}

    def deep_check(self, rel: str, entry: dict[str, Any]) -> str | None:
        """Re-read the object and recompute its ETag; a reason string when it differs."""
        etag = entry.get("etag")
        if not etag or not re.fullmatch(r"[0-9a-f]{32}(-\d+)?", etag):
            return None  # nothing recomputable recorded (e.g. an SSE-KMS ETag)
        key = self._key(rel)
        parts = int(etag.split("-")[1]) if "-" in etag else 0
        part_size = None
        if parts:
            part_size = self.client.head_object(Bucket=self.bucket, Key=key, PartNumber=1)["ContentLength"]
        body = self.client.get_object(Bucket=self.bucket, Key=key)["Body"]
        got = etag_of(iter(lambda: body.read(_CHUNK), b""), part_size)
        return None if got == etag else f"{rel}: checksum mismatch (etag {got} != {etag})"


def etag_of(chunks: Iterator[bytes], part_size: int | None) -> str:
    """S3's ETag of an unencrypted object: MD5, or MD5 of the parts' MD5s plus `-N`."""
    if not part_size:
        md5 = hashlib.md5()
        for c in chunks:
            md5.update(c)
        return md5.hexdigest()
    digests, md5, filled = [], hashlib.md5(), 0
    for c in chunks:
        view = memoryview(c)
        while view:
            take = min(len(view), part_size - filled)
            md5.update(view[:take])
            filled += take
            view = view[take:]
            if filled == part_size:
                digests.append(md5.digest())
                md5, filled = hashlib.md5(), 0
    if filled:
        digests.append(md5.digest())
    return f"{hashlib.md5(b''.join(digests)).hexdigest()}-{len(digests)}"


class FileStore:
    def __init__(self, uri: str):
        self.root = Path(local_path(uri))

    def list(self, rel: str = "") -> dict[str, ObjectStat]:
        base = self.root / rel if rel else self.root
        out: dict[str, ObjectStat] = {}
        if not base.is_dir():
            return out
        for dirpath, _, files in os.walk(base):
            for name in files:
                path = Path(dirpath) / name
                try:
                    out[path.relative_to(self.root).as_posix()] = ObjectStat(path.stat().st_size)
                except FileNotFoundError:
                    pass
        return out

    def stat(self, rel: str) -> ObjectStat | None:
        try:
            return ObjectStat((self.root / rel).stat().st_size)
        except FileNotFoundError:
            return None

    def read(self, rel: str) -> bytes | None:
        try:
            return (self.root / rel).read_bytes()
        except FileNotFoundError:
            return None

    def write(self, rel: str, data: bytes) -> None:
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)  # atomic: a reader sees the whole manifest or none

    def delete(self, rels: Iterable[str]) -> None:
        dirs: set[Path] = set()
        for rel in rels:
            (self.root / rel).unlink(missing_ok=True)
            dirs.update((self.root / rel).parents)
        for d in sorted(dirs, key=lambda p: len(p.parts), reverse=True):
            if d != self.root and self.root in d.parents:
                try:
                    d.rmdir()
                except OSError:
                    pass

    def _sha256(self, rel: str) -> str:
        h = hashlib.sha256()
        with open(self.root / rel, "rb") as f:
            while chunk := f.read(_CHUNK):
                h.update(chunk)
        return h.hexdigest()

    def checksum(self, rel: str, stat: ObjectStat) -> dict[str, Any]:
        return {"sha256": self._sha256(rel)}

    def deep_check(self, rel: str, entry: dict[str, Any]) -> str | None:
        if "sha256" not in entry:
            return None
        got = self._sha256(rel)
        return None if got == entry["sha256"] else f"{rel}: checksum mismatch (sha256 {got} != {entry['sha256']})"


def open_store(uri: str | os.PathLike[str]) -> S3Store | FileStore:
    return S3Store(str(uri)) if is_s3(uri) else FileStore(str(uri))
