"""Acceptance 2 of issue 6, the kill -9 half: a rank SIGKILLed in the middle of a save to s3://.

Three runs of the real trainer (world size 2, gloo, rank processes started here so the test
holds their pids): an uninterrupted reference; a run checkpointing every 10 steps through a
slow per-connection proxy (so the step-20 save takes seconds) whose rank 1 is killed once its
step-20 multipart upload is open; and a run resumed from `manifest.last_good`. The S3-outage
half is in test_s3io.py.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from aerie_checkpoint import gc as ckpt_gc
from aerie_checkpoint import manifest
from tests.helpers.tiny_trainer import trainer_env, write_tiny_config

REPO = Path(__file__).resolve().parents[3]
STEPS, EVERY = 30, 10
RATE = 64e3  # bytes/s per connection: a rank's ~1 MB of shards takes seconds to upload


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_config(directory: Path, cache: Path) -> Path:
    return write_tiny_config(
        directory / "config.yaml",
        cache,
        grad_accum=2,
        steps=STEPS,
        warmup=4,
        eval_every=0,
        instance_type="c7i.xlarge",
    )


def launch(workdir: Path, config: Path, name: str, env: dict[str, str]) -> tuple[list[subprocess.Popen], Path]:
    """Start both ranks of a world of 2 (no torchrun: the test needs each rank's own pid)."""
    metrics = workdir / name / "metrics"
    port = str(free_port())
    procs = []
    for rank in (0, 1):
        world = {
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": "2",
            "LOCAL_WORLD_SIZE": "2",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": port,
        }
        full_env = trainer_env(workdir / name, **{"PYTHONPATH": str(REPO), "AERIE_CHECKPOINT_URI": "", **world, **env})
        log = open(workdir / f"{name}-rank{rank}.log", "w")
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "trainer.train", "--config", str(config)],
                cwd=workdir,
                env=full_env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )
    return procs, metrics


def wait_all(procs: list[subprocess.Popen], timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    try:
        return [p.wait(max(0.1, deadline - time.monotonic())) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def losses(metrics: Path, rank: int) -> dict[int, float]:
    out = {}
    for line in (metrics / f"rank-{rank:05d}.jsonl").read_text().splitlines():
        try:
            rec = json.loads(line)
        except ValueError:  # a line cut short by the kill
            continue
        if rec["event"] is None:
            out[rec["step"]] = rec["loss"]
    return out


def tail(workdir: Path, name: str) -> str:
    return "\n".join(f"--- {p.name}\n" + p.read_text()[-3000:] for p in sorted(workdir.glob(f"{name}-rank*.log")))


@pytest.fixture(scope="module")
def data_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("data-cache")


def test_kill_9_of_a_rank_mid_save(tmp_path, data_cache, s3_prefix, s3_server):
    from devtools.s3proxy import ThrottlingProxy

    config = write_config(tmp_path, data_cache)
    step10, step20 = manifest.checkpoint_uri(s3_prefix, 10), manifest.checkpoint_uri(s3_prefix, 20)

    # The run that never crashes (no checkpoints: saving does not change the losses).
    procs, reference = launch(tmp_path, config, "reference", {})
    assert wait_all(procs, 120) == [0, 0], tail(tmp_path, "reference")

    # The crashing run: its ranks reach S3 through the throttling proxy; the test (and GC)
    # talk to the server directly, so they are not slowed.
    with ThrottlingProxy("127.0.0.1", s3_server.port, rate=RATE) as proxy:
        procs, crashed = launch(
            tmp_path,
            config,
            "crashed",
            {
                "AERIE_S3_ENDPOINT": proxy.endpoint_url,
                "AWS_ENDPOINT_URL": proxy.endpoint_url,
                "AERIE_CHECKPOINT_URI": s3_prefix,
                "AERIE_CHECKPOINT_EVERY": str(EVERY),
            },
        )
        try:
            # Mid-save: step 10 committed, rank 1's step-20 shard upload open, nothing committed for 20.
            deadline = time.monotonic() + 90
            mid_save = []
            while not mid_save:
                assert time.monotonic() < deadline, "never saw the step-20 save in flight\n" + tail(tmp_path, "crashed")
                assert all(p.poll() is None for p in procs), tail(tmp_path, "crashed")
                if manifest.read_manifest(step10) is not None:
                    mid_save = [u["key"] for u in ckpt_gc.list_incomplete_uploads(step20) if "/__1_" in u["key"]]
                time.sleep(0.05)
            assert manifest.read_manifest(step20) is None
            os.kill(procs[1].pid, signal.SIGKILL)
            # Rank 0 fails in its next collective (its peer is gone); give it time to commit,
            # were it (wrongly) going to.
            codes = wait_all(procs, 60)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
    assert codes[1] == -signal.SIGKILL and codes[0] != 0, (codes, tail(tmp_path, "crashed"))

    # No manifest for the interrupted save; the previous checkpoint is the resume point.
    assert manifest.read_manifest(step20) is None
    assert manifest.last_good(s3_prefix) == step10
    states = {c.step: c.state for c in manifest.list_checkpoints(s3_prefix)}
    assert states[10] == "good" and states.get(20, "incomplete") == "incomplete"

    # The dead rank's multipart uploads are left over; GC lists them (dry run) and aborts them.
    left = {u["key"] for u in ckpt_gc.list_incomplete_uploads(s3_prefix)}
    assert set(mid_save) <= left and all(k.startswith(step20.split("/", 3)[3] + "/") for k in left)
    assert set(ckpt_gc.collect(s3_prefix, dry_run=True)["aborted_uploads"]) == left
    result = ckpt_gc.collect(s3_prefix, abort_uploads_older_than_s=0)
    assert set(result["aborted_uploads"]) == left and result["deleted"] == []
    assert ckpt_gc.list_incomplete_uploads(s3_prefix) == []
    assert manifest.last_good(s3_prefix) == step10

    # Resume from last_good, checkpointing again over the debris of the dead save.
    procs, resumed = launch(
        tmp_path,
        config,
        "resumed",
        {
            "AERIE_RESUME_FROM": manifest.last_good(s3_prefix),
            "AERIE_CHECKPOINT_URI": s3_prefix,
            "AERIE_CHECKPOINT_EVERY": str(EVERY),
        },
    )
    assert wait_all(procs, 120) == [0, 0], tail(tmp_path, "resumed")
    for rank in (0, 1):
        ref, before, after = losses(reference, rank), losses(crashed, rank), losses(resumed, rank)
        assert sorted(ref) == list(range(1, STEPS + 1)) and sorted(after) == list(range(EVERY + 1, STEPS + 1))
        assert all(before[s] == ref[s] for s in before)  # the crashed run was the same training
        assert all(after[s] == ref[s] for s in after), rank  # bitwise
    assert manifest.verify(step20, deep=True).good
    assert manifest.last_good(s3_prefix) == manifest.checkpoint_uri(s3_prefix, STEPS)
