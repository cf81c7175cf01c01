"""A third-party trainer's checkpoints (agent/byo_checkpoints.py) against the loopback S3 server:
only finished, settled directories are uploaded; the manifest is the commit; a killed upload leaves
none; a restore is verified before it is put in place; a superseded attempt cannot commit."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from aerie_checkpoint import manifest
from aerie_checkpoint.fence import Superseded
from aerie_contracts import byo
from agent.byo_checkpoints import ASIDE, CheckpointSync, finished_candidates, hand_over, lightning_step, local_dir


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
    """The gate is the fenced commit's (aerie_checkpoint/fence.py); here it answers as the control
    plane does for a superseded attempt (tests/e2e/test_fencing.py runs the real one)."""
    root = tmp_path / "ck"
    sync = CheckpointSync(root=root, marker=byo.MARKER_HF, prefix=s3_prefix, attempt=1, gate=_Gate())
    hf_checkpoint(root, 9)
    settle(sync)
    assert "Superseded" in repr(sync.failed) or "no longer" in sync.failed["checkpoint-9"]
    assert manifest.last_good(s3_prefix) is None


# --- Lightning: flat files from the real script (examples/byo/lightning_train.py) -----------------


def run_lightning(*args: str) -> str:
    """The stock Lightning script in a subprocess, output a pipe (as agent/rank.py runs a rank)."""
    import subprocess
    import sys

    pytest.importorskip("lightning")
    script = Path(__file__).resolve().parents[2] / "examples" / "byo" / "lightning_train.py"
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE")}
    proc = subprocess.run(
        [sys.executable, str(script), *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, timeout=300
    )
    out = proc.stdout.decode(errors="replace")
    assert proc.returncode == 0, out[-3000:]
    return out


def test_lightning_default_layout_is_recognised(tmp_path, s3_prefix):
    """No dirpath: the default ModelCheckpoint's epoch-end file under lightning_logs/version_0/checkpoints/."""
    root = tmp_path / "out"
    run_lightning("--root-dir", str(root), "--max-steps", "30")
    found = finished_candidates(root, byo.MARKER_LIGHTNING)
    assert {k: v[0] for k, v in found.items()} == {"lightning_logs/version_0/checkpoints/epoch=2-step=30.ckpt": 30}
    sync = CheckpointSync(root=root, marker=byo.MARKER_LIGHTNING, prefix=s3_prefix, attempt=1)
    settle(sync)
    uri = sync.done["lightning_logs/version_0/checkpoints/epoch=2-step=30.ckpt"]
    info = manifest.read_manifest(uri)
    assert info["step"] == 30 and info["extra"][byo.MANIFEST_LOCAL_FILE].endswith("epoch=2-step=30.ckpt")
    where = CheckpointSync(root=tmp_path / "node2", marker=byo.MARKER_LIGHTNING, prefix=s3_prefix).restore(uri)
    assert where == tmp_path / "node2" / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt"
    assert lightning_step(where) == 30


def test_lightning_checkpoints_commit_only_complete_files_and_restore_resumes(tmp_path, s3_prefix):
    """ModelCheckpoint(dirpath=..., every_n_train_steps=5, save_last=True): the file of step 15 is
    committed (last.ckpt, the same save, not twice); a half-written file never is; restored on a
    fresh node as last.ckpt, `trainer.fit(ckpt_path="last")` resumes at 15 and goes on to 30."""
    ck = tmp_path / "ck"
    out = run_lightning(
        "--root-dir", str(tmp_path / "run1"), "--checkpoint-dir", str(ck), "--save-steps", "5", "--max-steps", "17"
    )
    assert "global_step=17" in out
    assert sorted(p.name for p in ck.iterdir()) == ["epoch=1-step=15.ckpt", "last.ckpt"]  # save_top_k=1 rotated 5, 10
    assert lightning_step(ck / "last.ckpt") == 15
    assert {k: v[0] for k, v in finished_candidates(ck, byo.MARKER_LIGHTNING).items()} == {"epoch=1-step=15.ckpt": 15}

    # A save still being written (or cut short: a copy across filesystems writes the final name):
    # its zip directory is not there yet, so it is no checkpoint, however long its size stays put.
    whole = (ck / "epoch=1-step=15.ckpt").read_bytes()
    (ck / "epoch=3-step=40.ckpt").write_bytes(whole[: len(whole) // 2])
    sync = CheckpointSync(root=ck, marker=byo.MARKER_LIGHTNING, prefix=s3_prefix, attempt=1)
    for t in (1000.0, 1003.0, 1006.0, 1009.0):
        sync.tick(t)
        sync.wait(60)
    assert list(sync.done) == ["epoch=1-step=15.ckpt"] and not sync.failed
    assert [c.step for c in manifest.list_checkpoints(s3_prefix)] == [15]
    (ck / "epoch=3-step=40.ckpt").unlink()

    # A complete file that is still changing (size or mtime) is not uploaded until it settles.
    (ck / "epoch=2-step=20.ckpt").write_bytes(whole)
    sync.tick(2000.0)
    (ck / "epoch=2-step=20.ckpt").write_bytes(whole + b"")  # rewritten: a new mtime
    os.utime(ck / "epoch=2-step=20.ckpt", ns=(1, 1))
    sync.tick(2000.0 + sync.settle_s + 0.1)
    assert not sync.busy() and "epoch=2-step=20.ckpt" not in sync.done
    (ck / "epoch=2-step=20.ckpt").unlink()

    uri = sync.done["epoch=1-step=15.ckpt"]
    assert manifest.last_good(s3_prefix) == uri and manifest.verify(uri, deep=True)
    assert not (ck / ".aerie-upload").exists() or not any((ck / ".aerie-upload").iterdir())  # staging cleaned

    # Another node (an empty directory), the next attempt: the committed file as last.ckpt.
    node2 = tmp_path / "node2" / "ck"
    restorer = CheckpointSync(root=node2, marker=byo.MARKER_LIGHTNING, prefix=s3_prefix, attempt=2)
    where = restorer.restore(uri)
    assert where == node2 / "last.ckpt" and where.read_bytes() == whole
    restorer.tick(5000.0)
    restorer.tick(5010.0)
    assert not restorer.busy() and not restorer.committed  # restored: not uploaded again

    out = run_lightning(
        "--root-dir", str(tmp_path / "run2"), "--checkpoint-dir", str(node2), "--save-steps", "5", "--max-steps", "30"
    )
    assert f"Restoring states from the checkpoint path at {node2 / 'last.ckpt'}" in out
    assert "global_step=30" in out
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    from agent.tb_progress import event_files

    steps = sorted(
        ev.step + 1
        for path in event_files(tmp_path / "run2")
        for ev in EventFileLoader(str(path)).Load()
        if any(v.tag == "train_loss" for v in ev.summary.value)
    )
    assert steps == list(range(16, 31))  # it went on from the committed step 15, not from 0


def test_lightning_file_rotated_away_mid_upload_is_still_committed(tmp_path, s3_prefix, monkeypatch):
    """save_top_k removes the previous file at the next save; the upload reads a hard link of it."""
    import aerie_s3.upload as upload

    src = tmp_path / "src"
    run_dir = src / "ck"
    run_dir.mkdir(parents=True)
    real = tmp_path / "real.ckpt"
    _make_fake_lightning_ckpt(real, step=25)
    (run_dir / "epoch=2-step=25.ckpt").write_bytes(real.read_bytes())

    original = upload.upload_files

    def rotating(pairs, **kw):
        (run_dir / "epoch=2-step=25.ckpt").unlink()  # the trainer's next save rotated it away
        return original(pairs, **kw)

    monkeypatch.setattr(upload, "upload_files", rotating)
    sync = CheckpointSync(root=run_dir, marker=byo.MARKER_LIGHTNING, prefix=s3_prefix, attempt=1)
    settle(sync)
    assert not sync.failed, sync.failed
    uri = sync.done["epoch=2-step=25.ckpt"]
    where = CheckpointSync(root=tmp_path / "n2", marker=byo.MARKER_LIGHTNING, prefix=s3_prefix).restore(uri)
    assert where.read_bytes() == real.read_bytes() and lightning_step(where) == 25


def _make_fake_lightning_ckpt(path: Path, step: int) -> None:
    """A zip laid out as torch.save writes one, holding Lightning's leading keys (no torch needed)."""
    import pickle
    import zipfile

    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", pickle.dumps({"epoch": 2, "global_step": step, "state_dict": {}}, protocol=2))
        z.writestr("archive/version", "3\n")


def test_in_place_the_committed_resume_point_stays_and_everything_newer_is_set_aside(tmp_path, s3_prefix):
    """An in-place restart on rank 0's node: checkpoint-20 was committed from here and is the
    resume point; checkpoint-30 (written, never committed) and a half-written save are moved aside,
    so the unchanged script's `get_last_checkpoint` finds checkpoint-20; nothing is downloaded."""
    root = tmp_path / "ck"
    first = CheckpointSync(root=root, marker=byo.MARKER_HF, prefix=s3_prefix, attempt=1)
    hf_checkpoint(root, 20)
    settle(first)
    uri = first.done["checkpoint-20"]
    hf_checkpoint(root, 30)  # the failed attempt's newer save: never committed
    hf_checkpoint(root, 40, marker=False)  # a save cut short
    (root / "runs").mkdir()  # the trainer's other files in its output directory

    second = CheckpointSync(root=root, marker=byo.MARKER_HF, prefix=s3_prefix, attempt=2)
    assert hand_over(first, second, uri, "attempt-1") == "checkpoint-20"
    assert sorted(p.name for p in root.iterdir()) == [ASIDE, "checkpoint-20"]
    aside = root / ASIDE / "attempt-1"
    assert sorted(p.name for p in aside.iterdir()) == ["checkpoint-30", "checkpoint-40", "runs"]
    assert list(finished_candidates(root, byo.MARKER_HF)) == ["checkpoint-20"]
    settle(second)
    assert second.done == {"checkpoint-20": ""}  # kept, not uploaded again

    # The next hand-over keeps one aside (the newest), and a resume point whose files changed
    # since they were committed is set aside too: the caller restores it from S3.
    hf_checkpoint(root, 50)
    (root / "checkpoint-20" / "optimizer.pt").write_bytes(b"changed")
    third = CheckpointSync(root=root, marker=byo.MARKER_HF, prefix=s3_prefix, attempt=3)
    assert hand_over(first, third, uri, "attempt-2") is None
    assert [p.name for p in (root / ASIDE).iterdir()] == ["attempt-2"]
    assert sorted(p.name for p in (root / ASIDE / "attempt-2").iterdir()) == ["checkpoint-20", "checkpoint-50"]
    where = third.restore(uri)
    assert where == root / "checkpoint-20" and (where / "optimizer.pt").read_bytes() != b"changed"
    assert list(finished_candidates(root, byo.MARKER_HF)) == ["checkpoint-20"]


def test_in_place_without_a_resume_point_the_directory_starts_empty(tmp_path, s3_prefix):
    root = tmp_path / "ck"
    first = CheckpointSync(root=root, marker="ckpt-*/DONE", prefix=s3_prefix, attempt=1, uploads=False)
    (root / "ckpt-5").mkdir(parents=True)
    (root / "ckpt-5" / "DONE").write_text("")
    second = CheckpointSync(root=root, marker="ckpt-*/DONE", prefix=s3_prefix, attempt=2, uploads=False)
    assert hand_over(first, second, None, "attempt-1") is None
    assert [p.name for p in root.iterdir()] == [ASIDE] and finished_candidates(root, "ckpt-*/DONE") == {}
