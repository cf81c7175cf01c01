"""A third-party trainer's checkpoints (agent/byo_checkpoints.py) against the loopback S3 server:
only finished, settled directories are uploaded; the manifest is the commit; a killed upload leaves
none; a restore is verified before it is put in place; a superseded attempt cannot commit."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from aerie_contracts import byo
from agent.byo_checkpoints import CheckpointSync, finished_candidates, local_dir
from trainer.checkpoint import manifest
from trainer.checkpoint.fence import Superseded


def hf_checkpoint(root: Path, step: int, marker: bool = True, size: int = 3000) -> Path:
    d = root / f"checkpoint-{step}"
    d.mkdir(parents=True)
    (d / "model.safetensors").write_bytes(os.urandom(size))
    (d / "optimizer.pt").write_bytes(os.urandom(size // 2))
    if marker:
        (d / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    return d


def settle(sync: CheckpointSync, t0: float = 1000.0) -> None:
    """Two scans settle_s apart (the clock is passed in), then wait for the upload thread."""
    sync.tick(t0)
    sync.tick(t0 + sync.settle_s + 0.1)
    sync.wait(60)


def test_markers_and_local_path(tmp_path):
    hf_checkpoint(tmp_path / "hf", 10)
    hf_checkpoint(tmp_path / "hf", 20, marker=False)  # still being written
    assert {k: v[0] for k, v in finished_candidates(tmp_path / "hf", byo.MARKER_HF).items()} == {"checkpoint-10": 10}
    (tmp_path / "dcp" / "step-30").mkdir(parents=True)
    (tmp_path / "dcp" / "step-30" / ".metadata").write_bytes(b"x")
    (tmp_path / "dcp" / "step-40").mkdir()
    assert list(finished_candidates(tmp_path / "dcp", byo.MARKER_DCP)) == ["step-30"]
    (tmp_path / "mg" / "iter_0000050").mkdir(parents=True)
    (tmp_path / "mg" / "latest_checkpointed_iteration.txt").write_text("50\n")
    assert finished_candidates(tmp_path / "mg", byo.MARKER_MEGATRON)["iter_0000050"][0] == 50
    (tmp_path / "g" / "ckpt_0007").mkdir(parents=True)
    (tmp_path / "g" / "ckpt_0007" / "DONE").write_text("")
    assert finished_candidates(tmp_path / "g", "ckpt_*/DONE")["ckpt_0007"][0] == 7
    assert local_dir(None, tmp_path) == tmp_path / "checkpoints"  # /opt/ml/checkpoints under the ML root
    assert local_dir("/data/ck", tmp_path) == Path("/data/ck")


def test_only_a_finished_settled_checkpoint_is_committed_and_it_restores(tmp_path, s3_prefix):
    root = tmp_path / "ck"
    sync = CheckpointSync(root=root, marker=byo.MARKER_HF, prefix=s3_prefix, attempt=1)
    hf_checkpoint(root, 20, marker=False)
    settle(sync)
    assert sync.done == {} and manifest.list_checkpoints(s3_prefix) == []  # no marker: never uploaded

    (root / "checkpoint-20" / "trainer_state.json").write_text("{}")
    sync.tick(2000.0)
    (root / "checkpoint-20" / "optimizer.pt").write_bytes(os.urandom(5000))  # still growing
    sync.tick(2000.0 + sync.settle_s + 0.1)
    assert not sync.busy() and sync.done == {}  # changed since the last scan: the clock starts again
    settle(sync, 3000.0)
    uri = sync.done["checkpoint-20"]
    assert uri == manifest.checkpoint_uri(s3_prefix, 20, 1) and manifest.last_good(s3_prefix) == uri
    info = manifest.read_manifest(uri)
    assert info["step"] == 20 and info["extra"][byo.MANIFEST_LOCAL_DIR] == "checkpoint-20"
    assert manifest.verify(uri, deep=True)

    # Restore on another node (an empty directory): same files, same bytes.
    other = CheckpointSync(root=tmp_path / "other", marker=byo.MARKER_HF, prefix=s3_prefix, attempt=2)
    where = other.restore(uri)
    assert where == tmp_path / "other" / "checkpoint-20"
    for f in (root / "checkpoint-20").iterdir():
        assert (where / f.name).read_bytes() == f.read_bytes()
    other.tick(5000.0)
    other.tick(5010.0)
    assert not other.busy() and other.done == {"checkpoint-20": ""}  # restored: not uploaded again


def test_a_restore_that_fails_verification_is_refused(tmp_path, s3_prefix):
    root = tmp_path / "ck"
    sync = CheckpointSync(root=root, marker=byo.MARKER_HF, prefix=s3_prefix, attempt=1)
    hf_checkpoint(root, 5)
    settle(sync)
    uri = sync.done["checkpoint-5"]
    import boto3

    bucket, key = uri[5:].split("/", 1)
    boto3.client("s3").put_object(Bucket=bucket, Key=f"{key}/optimizer.pt", Body=b"short")  # size differs
    target = CheckpointSync(root=tmp_path / "r", marker=byo.MARKER_HF, prefix=s3_prefix)
    with pytest.raises(RuntimeError, match="wrong size"):
        target.restore(uri)
    assert not (tmp_path / "r" / "checkpoint-5").exists()  # nothing put in place for the trainer to find


def test_a_killed_upload_leaves_no_manifest(tmp_path, s3_prefix, monkeypatch):
    import aerie_s3.upload as upload

    def dies(pairs, **kw):
        upload.upload_files.__wrapped__(pairs[:1])  # some objects land, then the upload dies
        raise ConnectionError("killed")

    dies.__wrapped__ = upload.upload_files  # type: ignore[attr-defined]
    monkeypatch.setattr(upload, "upload_files", dies)
    root = tmp_path / "ck"
    sync = CheckpointSync(root=root, marker=byo.MARKER_HF, prefix=s3_prefix, attempt=1)
    hf_checkpoint(root, 7)
    settle(sync)
    assert "checkpoint-7" in sync.failed and manifest.last_good(s3_prefix) is None
    assert [c.state for c in manifest.list_checkpoints(s3_prefix)] == ["incomplete"]


class _Gate:
    attempt_id = "att-1"

    @property
    def check(self):
        raise Superseded("attempt att-1 is Failed, no longer its job's current attempt")


def test_a_superseded_attempt_cannot_commit(tmp_path, s3_prefix):
    """The gate is the fenced commit's (trainer/checkpoint/fence.py); here it answers as the control
    plane does for a superseded attempt (tests/e2e/test_fencing.py runs the real one)."""
    root = tmp_path / "ck"
    sync = CheckpointSync(root=root, marker=byo.MARKER_HF, prefix=s3_prefix, attempt=1, gate=_Gate())
    hf_checkpoint(root, 9)
    settle(sync)
    assert "Superseded" in repr(sync.failed) or "no longer" in sync.failed["checkpoint-9"]
    assert manifest.last_good(s3_prefix) is None
