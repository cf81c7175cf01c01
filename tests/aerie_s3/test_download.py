"""Many objects to files against the loopback S3 server: every verification path S3 offers,
an object rewritten mid-download, a stop request, and streaming uploads (completed or aborted).
Requests are counted at the server (moto's request log)."""

from __future__ import annotations

import os
import threading

import pytest
from botocore.config import Config

from aerie_s3.clients import boto3_client
from aerie_s3.download import Transfer, download
from aerie_s3.listing import list_prefix
from aerie_s3.ranged import Cancelled
from aerie_s3.settings import S3Settings
from aerie_s3.upload import StreamingUpload
from aerie_s3.verify import ChecksumMismatch, Expected, verify_file

MiB = 1 << 20


@pytest.fixture
def bucket(counting_s3, monkeypatch):
    return counting_s3.fresh_bucket(monkeypatch.setenv)


def _plain_client():
    """A client that adds no checksum to uploads: objects S3 knows only by size and ETag."""
    s = S3Settings.from_env()
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=s.endpoint_url,
        region_name=s.region,
        config=Config(request_checksum_calculation="when_required", s3={"addressing_style": "path"}),
    )


def test_objects_land_whole_and_verified_by_the_strongest_check_s3_offers(bucket, counting_s3, tmp_path):
    s3 = boto3_client()
    multipart = os.urandom(12 * MiB + 5)
    with StreamingUpload(f"s3://{bucket}/in/big.bin", part_size=5 * MiB) as f:  # composite CRC32, 3 parts
        for i in range(0, len(multipart), 300_000):
            f.write(multipart[i : i + 300_000])
    s3.put_object(Bucket=bucket, Key="in/crc.txt", Body=b"hello")  # full-object CRC32
    _plain_client().put_object(Bucket=bucket, Key="in/md5-only", Body=b"x" * 1000)  # ETag = MD5
    s3.put_object(Bucket=bucket, Key="in/sub/empty", Body=b"")
    objects = list_prefix(f"s3://{bucket}/in/")
    assert [o.key for o in objects] == ["in/big.bin", "in/crc.txt", "in/md5-only", "in/sub/empty"]

    mark = counting_s3.mark()
    seen = []
    stats = download(
        [Transfer(o, tmp_path / o.key) for o in objects], connections=4, on_done=lambda t, m: seen.append(m)
    )
    assert (tmp_path / "in/big.bin").read_bytes() == multipart
    assert (tmp_path / "in/crc.txt").read_bytes() == b"hello"
    assert (tmp_path / "in/sub/empty").read_bytes() == b""
    assert stats.objects == 4 and stats.bytes == len(multipart) + 5 + 1000
    assert stats.verified == {"CRC32-composite": 1, "CRC32": 2, "MD5": 1}
    assert sorted(seen) == ["CRC32", "CRC32", "CRC32-composite", "MD5"]
    assert not list(tmp_path.rglob("*.part"))
    gets = counting_s3.object_gets(bucket, mark)
    # 12 MiB cut into equal slices over 4 connections: ranged GETs, all of them parallel.
    assert gets["in/big.bin"] >= 4 and gets["in/crc.txt"] == 1 and gets["in/sub/empty"] == 0


def test_verify_file_names_a_wrong_size_or_checksum(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"hello")
    assert verify_file(path, Expected(5, "e", "MD5", "5d41402abc4b2a76b9719d911017c592")) == "MD5"
    with pytest.raises(ChecksumMismatch, match="6 bytes on disk"):
        path.write_bytes(b"hello!")
        verify_file(path, Expected(5, "e"))
    with pytest.raises(ChecksumMismatch, match="CRC32 is"):
        path.write_bytes(b"jello")
        verify_file(path, Expected(5, "e", "CRC32", "NhCmhg=="))


def test_an_object_rewritten_mid_download_is_fetched_again_and_a_second_failure_is_an_error(bucket, tmp_path):
    s3 = boto3_client()
    key = "mid/blob"
    s3.put_object(Bucket=bucket, Key=key, Body=os.urandom(2 * MiB))
    (obj,) = list_prefix(f"s3://{bucket}/mid/")
    chunks, rewrites = [], []

    def rewrite_once_per_pass(n):  # a pass's first slice in: S3 gets a new version of the object
        chunks.append(n)
        if len(chunks) % 8 == 1 and len(rewrites) < limit:  # 2 MiB = 8 slices of 256 KiB
            rewrites.append(n)
            s3.put_object(Bucket=bucket, Key=key, Body=os.urandom(2 * MiB))

    # One connection, 256 KiB slices: the rest of the object is read after the rewrite.
    settings = S3Settings.from_env({**os.environ, "AERIE_S3_READ_PART_SIZE": str(256 * 1024)})
    limit = 1
    stats = download([Transfer(obj, tmp_path / "a")], settings=settings, connections=1, on_bytes=rewrite_once_per_pass)
    assert stats.objects == 1 and len(rewrites) == 1 and len(chunks) == 16  # fetched twice
    assert (tmp_path / "a").read_bytes() == s3.get_object(Bucket=bucket, Key=key)["Body"].read()

    chunks.clear()
    rewrites.clear()
    limit = 2  # rewritten during both passes: never consistent, so the download fails
    with pytest.raises(ChecksumMismatch):
        download([Transfer(obj, tmp_path / "b")], settings=settings, connections=1, on_bytes=rewrite_once_per_pass)
    assert not (tmp_path / "b").exists() and not list(tmp_path.glob("b.part"))


def test_a_stop_request_ends_the_download_and_leaves_nothing(bucket, tmp_path):
    boto3_client().put_object(Bucket=bucket, Key="s/blob", Body=os.urandom(4 * MiB))
    (obj,) = list_prefix(f"s3://{bucket}/s/")
    stop = threading.Event()
    settings = S3Settings.from_env({**os.environ, "AERIE_S3_READ_PART_SIZE": str(256 * 1024)})
    with pytest.raises(Cancelled):
        download(
            [Transfer(obj, tmp_path / "x")], settings=settings, connections=1, stop=stop, on_bytes=lambda n: stop.set()
        )
    assert list(tmp_path.iterdir()) == []


def test_a_streaming_upload_left_on_an_error_leaves_no_object(bucket):
    s3 = boto3_client()
    with pytest.raises(RuntimeError), StreamingUpload(f"s3://{bucket}/up/aborted.bin", part_size=5 * MiB) as f:
        f.write(os.urandom(6 * MiB))  # one part uploaded already
        raise RuntimeError("tokenizer crashed")
    assert "Contents" not in s3.list_objects_v2(Bucket=bucket, Prefix="up/")
    assert not s3.list_multipart_uploads(Bucket=bucket).get("Uploads")
    with pytest.raises(OSError, match="NoSuchBucket"), StreamingUpload("s3://no-such-bucket-here/x") as f:
        f.write(b"data")


def test_a_download_larger_than_the_free_space_fails_before_any_byte_moves(tmp_path):
    from aerie_s3.download import _check_space
    from aerie_s3.listing import RemoteObject

    huge = RemoteObject("b", "k", 10**18, "e")
    with pytest.raises(OSError, match="GB free under"):
        _check_space([Transfer(huge, tmp_path / "k")], [Expected(huge.size, "e")])
    assert list(tmp_path.iterdir()) == []
