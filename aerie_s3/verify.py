"""Is a downloaded file the object S3 holds? Size always; a checksum whenever S3 has one.

What S3 can tell us, strongest first (HEAD with `ChecksumMode=ENABLED`):

- an additional checksum (CRC64NVME, CRC32C, CRC32, SHA256, SHA1) over the whole object
  (`ChecksumType: FULL_OBJECT`, or any checksum of a single-part upload);
- the same, composite: a checksum of the parts' checksums, "-N" (a multipart upload);
- the ETag, which is the MD5 of a single-part upload, or the MD5 of the parts' MD5s "-N" of a
  multipart one, unless the object is encrypted with SSE-KMS or SSE-C (then it is opaque).

A composite needs the part sizes: from `GetObjectAttributes` (exact, when S3 returns them), else
from the first part's size (`HEAD partNumber=1`), assuming every part but the last the same size
as every SDK's uploader writes them; if that assumption gives a mismatch, each part's size is
asked for (`HEAD partNumber=k`) before calling the file wrong. CRC32C and CRC64NVME are computed
with `awscrt` when it is installed, otherwise such objects fall back to the ETag (or size only).
"""

from __future__ import annotations

import base64
import hashlib
import re
import zlib
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from aerie_s3.listing import RemoteObject

CHUNK = 8 * 1024 * 1024
_MD5_HEX = re.compile(r"^[0-9a-f]{32}$")


class ChecksumMismatch(Exception):
    """The bytes on disk are not the object's (wrong size or checksum)."""


def _awscrt_checksums():
    try:
        from awscrt import checksums  # optional: CRC32C and CRC64NVME
    except ImportError:
        return None
    return checksums


class _Crc:
    """CRC as hashlib-like object; the digest is big-endian, as S3 encodes it."""

    def __init__(self, fn: Callable[[bytes, int], int], width: int):
        self.fn, self.width, self.value = fn, width, 0

    def update(self, data) -> None:
        self.value = self.fn(data, self.value)

    def digest(self) -> bytes:
        return self.value.to_bytes(self.width, "big")


def hasher(algorithm: str) -> Any | None:
    """A fresh hashlib-like object for an S3 checksum algorithm, or None if not computable here."""
    if algorithm == "CRC32":
        return _Crc(zlib.crc32, 4)
    if algorithm in ("SHA1", "SHA256", "MD5"):
        return hashlib.new(algorithm.lower())
    crt = _awscrt_checksums()
    if crt is not None and algorithm == "CRC32C":
        return _Crc(lambda d, v: crt.crc32c(d, v), 4)
    if crt is not None and algorithm == "CRC64NVME" and hasattr(crt, "crc64nvme"):
        return _Crc(lambda d, v: crt.crc64nvme(d, v), 8)
    return None


FLEXIBLE = ("CRC64NVME", "CRC32C", "CRC32", "SHA256", "SHA1")


@dataclass(frozen=True)
class Expected:
    """What the file must be: `size`, and `value` of `algorithm` (base64, or hex for MD5) over
    the whole object, or over `part_sizes` parts (composite)."""

    size: int
    etag: str
    algorithm: str | None = None
    value: str | None = None
    part_sizes: tuple[int, ...] | None = None
    parts_exact: bool = True

    @property
    def method(self) -> str:
        if self.algorithm is None:
            return "size"
        return f"{self.algorithm}{'-composite' if self.part_sizes else ''}"


def expected_of(client: Any, obj: RemoteObject) -> Expected:
    """Ask S3 what `obj` should hash to (one HEAD; one or two more for a composite)."""
    head = client.head_object(Bucket=obj.bucket, Key=obj.key, ChecksumMode="ENABLED")
    size = int(head["ContentLength"])
    etag = head.get("ETag", obj.etag).strip('"')
    etag_md5, _, etag_parts = etag.partition("-")
    kind = head.get("ChecksumType")
    for algorithm in FLEXIBLE:
        value = head.get(f"Checksum{algorithm}")
        if not value or hasher(algorithm) is None:
            continue
        value, _, parts = value.partition("-")
        composite = kind == "COMPOSITE" or bool(parts) or (kind is None and bool(etag_parts))
        if not composite:
            return Expected(size, etag, algorithm, value)
        count = int(parts or etag_parts or head.get("PartsCount") or 0)
        sizes, exact = _part_sizes(client, obj, size, count)
        if sizes:
            return Expected(size, etag, algorithm, value, sizes, exact)
        break
    if head.get("ServerSideEncryption", "").startswith("aws:kms") or head.get("SSECustomerAlgorithm"):
        return Expected(size, etag)  # the ETag of an SSE-KMS/SSE-C object is not an MD5
    if not _MD5_HEX.match(etag_md5):
        return Expected(size, etag)
    if not etag_parts:
        return Expected(size, etag, "MD5", etag_md5)
    sizes, exact = _part_sizes(client, obj, size, int(etag_parts))
    return Expected(size, etag, "MD5", etag_md5, sizes, exact) if sizes else Expected(size, etag)


def _part_sizes(client: Any, obj: RemoteObject, size: int, count: int) -> tuple[tuple[int, ...] | None, bool]:
    """The sizes of the `count` parts of a multipart object, and whether they are exact."""
    if count <= 0:
        return None, False
    try:
        sizes: list[int] = []
        marker = 0
        while len(sizes) < count:
            attrs = client.get_object_attributes(
                Bucket=obj.bucket, Key=obj.key, ObjectAttributes=["ObjectParts"], MaxParts=1000, PartNumberMarker=marker
            )
            parts = (attrs.get("ObjectParts") or {}).get("Parts") or []
            if not parts:
                break
            sizes += [int(p["Size"]) for p in parts]
            marker = int(parts[-1]["PartNumber"])
            if not (attrs.get("ObjectParts") or {}).get("IsTruncated"):
                break
        if len(sizes) == count and sum(sizes) == size:
            return tuple(sizes), True
    except Exception:  # not allowed (s3:GetObjectAttributes) or not supported: fall back
        pass
    try:
        first = int(client.head_object(Bucket=obj.bucket, Key=obj.key, PartNumber=1)["ContentLength"])
    except Exception:
        return None, False
    last = size - first * (count - 1)
    if first <= 0 or not 0 < last <= first:
        return None, False
    return (first,) * (count - 1) + (last,), False


def exact_part_sizes(client: Any, obj: RemoteObject, count: int) -> tuple[int, ...]:
    """Each part's size, one HEAD per part (only after a uniform-parts guess did not match)."""
    return tuple(
        int(client.head_object(Bucket=obj.bucket, Key=obj.key, PartNumber=k)["ContentLength"])
        for k in range(1, count + 1)
    )


def _encode(algorithm: str, digest: bytes) -> str:
    return digest.hex() if algorithm == "MD5" else base64.b64encode(digest).decode()


def compute(path: Path, expected: Expected) -> str:
    """The checksum of the file as S3 would state it (without the "-N" of a composite)."""
    algorithm = expected.algorithm
    assert algorithm is not None
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        if not expected.part_sizes:
            h = hasher(algorithm)
            while n := f.readinto(buf):
                h.update(view[:n])
            return _encode(algorithm, h.digest())
        outer = hasher(algorithm)
        for part in expected.part_sizes:
            h, left = hasher(algorithm), part
            while left and (n := f.readinto(view[: min(CHUNK, left)])):
                h.update(view[:n])
                left -= n
            outer.update(h.digest())
        return _encode(algorithm, outer.digest())


def verify_file(path: Path, expected: Expected, client: Any = None, obj: RemoteObject | None = None) -> str:
    """Raise ChecksumMismatch unless the file is the object; return how it was checked."""
    size = Path(path).stat().st_size
    if size != expected.size:
        raise ChecksumMismatch(f"{path}: {size} bytes on disk, the object has {expected.size}")
    if expected.algorithm is None:
        return expected.method
    got = compute(path, expected)
    if got != expected.value and expected.part_sizes and not expected.parts_exact and client and obj:
        expected = replace(expected, part_sizes=exact_part_sizes(client, obj, len(expected.part_sizes)))
        got = compute(path, expected)
    if got != expected.value:
        raise ChecksumMismatch(f"{path}: {expected.method} is {got}, the object's is {expected.value}")
    return expected.method
