"""The manifest decides what is good, on the real loopback S3 server and on local files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from aerie_checkpoint import gc as ckpt_gc
from aerie_checkpoint import manifest
from aerie_s3.clients import boto3_client
from aerie_s3.settings import is_s3, parse_uri


@pytest.fixture(params=["s3", "file"])
def prefix(request, tmp_path):
    if request.param == "s3":
        return request.getfixturevalue("s3_prefix")
    return f"file://{tmp_path / 'ckpt'}"


def put(uri: str, data: bytes) -> None:
    if is_s3(uri):
        bucket, key = parse_uri(uri)
        boto3_client().put_object(Bucket=bucket, Key=key, Body=data)
    else:
        path = Path(uri.removeprefix("file://"))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def delete(uri: str) -> None:
    if is_s3(uri):
        bucket, key = parse_uri(uri)
        boto3_client().delete_object(Bucket=bucket, Key=key)
    else:
        Path(uri.removeprefix("file://")).unlink()


def save(prefix: str, step: int, commit: bool = True) -> str:
    """A fake checkpoint: two shard files and DCP's .metadata, committed unless told not to."""
    uri = manifest.checkpoint_uri(prefix, step)
    put(f"{uri}/__0_0.distcp", bytes([step % 256]) * 1000)
    put(f"{uri}/__1_0.distcp", b"y" * (2000 + step))
    put(f"{uri}/.metadata", b"meta")
    if commit:
        manifest.commit(
            uri,
            step=step,
            tokens=step * 100,
            world={"world_size": 2},
            config_hash="cfg",
            code_version="abc123",
            metrics={"loss": 1.5},
        )
    return uri


def test_commit_records_every_object_and_verifies(prefix):
    uri = save(prefix, 500)
    assert uri.endswith("/step_00000500")
    m = manifest.read_manifest(uri)
    assert m["step"] == 500 and m["tokens"] == 50000 and m["world"] == {"world_size": 2}
    assert m["config_hash"] == "cfg" and m["code_version"] == "abc123" and m["metrics"] == {"loss": 1.5}
    assert [o["key"] for o in m["objects"]] == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    assert [o["size"] for o in m["objects"]] == [4, 1000, 2500]
    assert all(("etag" in o) if is_s3(prefix) else ("sha256" in o) for o in m["objects"])
    assert m["total_bytes"] == 3504
    assert manifest.verify(uri).good
    assert manifest.verify(uri, deep=True).good


def test_no_manifest_missing_object_or_wrong_size_is_not_good(prefix):
    incomplete = save(prefix, 100, commit=False)
    v = manifest.verify(incomplete)
    assert not v.good and "no manifest" in v.reasons[0]

    missing = save(prefix, 200)
    delete(f"{missing}/__1_0.distcp")
    v = manifest.verify(missing)
    assert not v.good and any("__1_0.distcp: missing" in r for r in v.reasons)

    resized = save(prefix, 300)
    put(f"{resized}/__0_0.distcp", b"short")
    v = manifest.verify(resized)
    assert not v.good and any("size 5 != 1000" in r for r in v.reasons)

    assert manifest.last_good(prefix) is None
    states = {i.step: i.state for i in manifest.list_checkpoints(prefix)}
    assert states == {100: "incomplete", 200: "corrupt", 300: "corrupt"}


def test_deep_verify_catches_same_size_corruption(prefix):
    uri = save(prefix, 10)
    put(f"{uri}/__0_0.distcp", b"Z" * 1000)  # same size, other bytes
    assert manifest.verify(uri).good  # shallow: sizes only
    v = manifest.verify(uri, deep=True)
    assert not v.good and "checksum mismatch" in v.reasons[0]


def test_deep_verify_of_a_multipart_object(s3_prefix):
    """S3 ETags of multipart uploads are MD5s of part MD5s; deep verify recomputes them."""
    uri = manifest.checkpoint_uri(s3_prefix, 1)
    bucket, key = parse_uri(f"{uri}/__0_0.distcp")
    client = boto3_client()
    up = client.create_multipart_upload(Bucket=bucket, Key=key)
    parts = []
    for n, chunk in enumerate([b"a" * (5 << 20), b"b" * (5 << 20), b"c" * 1234], start=1):
        r = client.upload_part(Bucket=bucket, Key=key, UploadId=up["UploadId"], PartNumber=n, Body=chunk)
        parts.append({"ETag": r["ETag"], "PartNumber": n})
    client.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=up["UploadId"], MultipartUpload={"Parts": parts})
    m = manifest.commit(uri, step=1)
    assert m["objects"][0]["etag"].endswith("-3")
    assert manifest.verify(uri, deep=True).good


def test_last_good_skips_newer_broken_and_bad(prefix):
    save(prefix, 100)
    good = save(prefix, 200)
    save(prefix, 300, commit=False)  # a save that died
    assert manifest.last_good(prefix) == good
    newest = save(prefix, 400)
    assert manifest.last_good(prefix) == newest
    manifest.mark_bad(newest, "loss diverged after resume")
    assert manifest.last_good(prefix) == good
    v = manifest.verify(newest)
    assert not v.good and "loss diverged" in v.reasons[0]
    # mark_bad deletes nothing
    assert manifest.read_manifest(newest)["step"] == 400
    infos = manifest.list_checkpoints(prefix)
    assert [(i.step, i.state) for i in infos] == [(100, "good"), (200, "good"), (300, "incomplete"), (400, "bad")]
    assert infos[0].bytes > 3504  # objects + manifest


def test_list_ignores_other_objects(prefix):
    put(f"{prefix}/notes.txt", b"hi")
    put(f"{prefix}/step_12/x", b"hi")  # not 8 digits: not a checkpoint directory
    save(prefix, 7)
    assert [i.step for i in manifest.list_checkpoints(prefix)] == [7]


def test_gc_keeps_last_every_protected_and_newest_good(prefix):
    for step in range(100, 1100, 100):
        save(prefix, step)
    save(prefix, 1100, commit=False)  # a save in progress: never touched
    manifest.mark_bad(manifest.checkpoint_uri(prefix, 1000), "bad eval")
    deleted = ckpt_gc.prune(prefix, keep_last=2, keep_every=500, protect=[300])
    steps_left = [i.step for i in manifest.list_checkpoints(prefix)]
    # good: 100..900; newest good 900; keep_last 2 -> 800, 900; every 500 -> 500; protect 300;
    # 1000 (bad) and 1100 (in progress) are newer than the newest good one.
    assert steps_left == [300, 500, 800, 900, 1000, 1100]
    assert sorted(int(u.rsplit("_", 1)[1]) for u in deleted) == [100, 200, 400, 600, 700]
    assert manifest.last_good(prefix) == manifest.checkpoint_uri(prefix, 900)
    assert ckpt_gc.prune(prefix, keep_last=2, keep_every=500, protect=[300]) == []


def test_gc_never_deletes_the_newest_good_one(prefix):
    save(prefix, 1)
    only = save(prefix, 2)
    save(prefix, 3, commit=False)
    assert ckpt_gc.prune(prefix, keep_last=0) == [manifest.checkpoint_uri(prefix, 1)]
    assert manifest.last_good(prefix) == only


def test_gc_without_any_good_checkpoint_deletes_nothing(prefix):
    save(prefix, 1, commit=False)
    save(prefix, 2, commit=False)
    assert ckpt_gc.prune(prefix, keep_last=0) == []


def test_gc_deletes_broken_ones_older_than_newest_good(prefix):
    save(prefix, 1, commit=False)
    broken = save(prefix, 2)
    delete(f"{broken}/.metadata")
    save(prefix, 3)
    deleted = ckpt_gc.prune(prefix, keep_last=5)
    assert deleted == [manifest.checkpoint_uri(prefix, 1), manifest.checkpoint_uri(prefix, 2)]


def test_commit_of_an_empty_checkpoint_fails(prefix):
    with pytest.raises(FileNotFoundError):
        manifest.commit(manifest.checkpoint_uri(prefix, 5), step=5)


def test_incomplete_multipart_uploads_are_listed_and_aborted(s3_prefix):
    client = boto3_client()
    bucket, key = parse_uri(f"{s3_prefix}/step_00000001/__0_0.distcp")
    up = client.create_multipart_upload(Bucket=bucket, Key=key)
    client.upload_part(Bucket=bucket, Key=key, UploadId=up["UploadId"], PartNumber=1, Body=b"x" * 100)
    client.create_multipart_upload(Bucket=bucket, Key="elsewhere/obj")  # not under the prefix
    listed = ckpt_gc.list_incomplete_uploads(s3_prefix)
    assert [(u["key"], u["upload_id"]) for u in listed] == [(key, up["UploadId"])]
    aborted = ckpt_gc.abort_incomplete_uploads(s3_prefix)
    assert [u["upload_id"] for u in aborted] == [up["UploadId"]]
    assert ckpt_gc.list_incomplete_uploads(s3_prefix) == []
    assert len(ckpt_gc.list_incomplete_uploads(f"s3://{bucket}/elsewhere")) == 1


def test_incomplete_uploads_on_files_is_empty(tmp_path):
    assert ckpt_gc.list_incomplete_uploads(str(tmp_path)) == []
    assert ckpt_gc.abort_incomplete_uploads(str(tmp_path)) == []


def test_plain_paths_work(tmp_path):
    uri = save(str(tmp_path / "ck"), 42)
    assert manifest.last_good(tmp_path / "ck") == uri
    assert json.loads(Path(uri, "manifest.json").read_text())["step"] == 42


def test_gc_collect_dry_run_then_real(s3_prefix):
    from aerie_checkpoint import gc as ckpt_gc

    for step in (1, 2, 3):
        save(s3_prefix, step)
    bucket, key = parse_uri(f"{s3_prefix}/step_00000004/__0_0.distcp")
    boto3_client().create_multipart_upload(Bucket=bucket, Key=key)  # a save that died
    dry = ckpt_gc.collect(s3_prefix, keep_last=1, abort_uploads_older_than_s=0, dry_run=True)
    assert len(dry["deleted"]) == 2 and dry["aborted_uploads"] == [key]
    assert len(manifest.list_checkpoints(s3_prefix)) == 3
    real = ckpt_gc.collect(s3_prefix, keep_last=1, abort_uploads_older_than_s=0)
    assert real["deleted"] == dry["deleted"] and real["aborted_uploads"] == [key]
    assert [i.step for i in manifest.list_checkpoints(s3_prefix)] == [3]
    assert ckpt_gc.list_incomplete_uploads(s3_prefix) == []
