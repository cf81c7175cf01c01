"""trainer.checkpoint.dcp: full-state round trips (DDP, FSDP2, world size 2, file:// and s3://),
asynchronous saves, metrics events, manifest commits, and failed saves that commit nothing."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from aerie_checkpoint import manifest
from tests.helpers.state_worker import run_two_ranks
from trainer.checkpoint import dcp as ck
from trainer.metrics import MetricsWriter

# Run by torchrun on 2 ranks: train, save asynchronously while training on, load into a model
# built from another seed, and compare everything (full tensors) with the state at save time.
WORKER = r"""
import sys, time
import torch, torch.distributed as dist
torch.set_num_threads(1)
from trainer import parallel
from trainer.checkpoint import dcp as ck
from tests.helpers.state_worker import (
    EXTRA, draws, finish, full, make, restored, same, seed_rank, train,
)

uri, parallelism, out = sys.argv[1], sys.argv[2], sys.argv[3]
world = parallel.init_distributed()
group = dist.new_group(backend="gloo")

seed_rank(world.rank)
model, opt, sched = make(world, parallelism, 0)
train(model, opt, sched, 3)
expected, expected_sched = full(model, opt), sched.state_dict()
t0 = time.perf_counter()
future = ck.save(uri, model, opt, sched, EXTRA, async_=True, process_group=group)
blocked_s = time.perf_counter() - t0
before = draws()
train(model, opt, sched, 2)  # training goes on while the save is written: must not leak into it
future.result()
dist.barrier()

model2, opt2, sched2 = make(world, parallelism, 1)
train(model2, opt2, sched2, 1)
assert not same(full(model2, opt2)[0], expected[0])
got_extra = ck.load(uri, model2, opt2, sched2, process_group=group)
result = restored(model2, opt2, sched2, got_extra, expected, expected_sched, before)
result["blocked_s"] = blocked_s
# Both continue identically after the restore.
train(model2, opt2, sched2, 1)
finish(out, world.rank, result)
"""

# What every rank of a round trip reports (besides the time the save blocked it).
RESTORED = dict.fromkeys(("model", "optim", "scheduler", "rng", "extra"), True)


def run_worker(tmp_path: Path, uri: str, parallelism: str) -> list[dict]:
    return run_two_ranks(tmp_path, WORKER, uri, parallelism)


def assert_restored(results: list[dict]) -> None:
    for result in results:
        assert {k: v for k, v in result.items() if k != "blocked_s"} == RESTORED


@pytest.mark.parametrize("parallelism", ["ddp", "fsdp2"])
def test_full_state_round_trip_file(tmp_path, parallelism):
    assert_restored(run_worker(tmp_path, f"file://{tmp_path}/ckpt/step_00000003", parallelism))
    saved = {p.name for p in (tmp_path / "ckpt" / "step_00000003").iterdir()}
    assert ".metadata" in saved and any(name.endswith(".distcp") for name in saved)


@pytest.mark.parametrize("parallelism", ["ddp", "fsdp2"])
def test_full_state_round_trip_s3(tmp_path, s3_prefix, parallelism):
    assert_restored(run_worker(tmp_path, f"{s3_prefix}/step_00000003", parallelism))


# --- Checkpointer, in this process as a world of one ---------------------------------------------------


@pytest.fixture(scope="module")
def world_of_one():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.fixture
def run_state(world_of_one):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 8))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    model(torch.randn(4, 64)).sum().backward()
    opt.step()
    return model, opt, sched


def events(path: Path) -> list[tuple]:
    return [(r["event"], r["step"], r.get("ok")) for r in map(json.loads, path.read_text().splitlines())]


class SlowWriter(torch.distributed.checkpoint.FileSystemWriter):
    def write_data(self, plan, planner):
        time.sleep(1.0)
        return super().write_data(plan, planner)


class FailingWriter(torch.distributed.checkpoint.FileSystemWriter):
    def write_data(self, plan, planner):
        raise OSError("injected: storage went away")


def test_checkpointer_is_asynchronous_and_commits_a_manifest(tmp_path, run_state, monkeypatch):
    model, opt, sched = run_state
    monkeypatch.setattr(ck, "_writer", lambda uri, n: SlowWriter(ck.local_path(uri)))
    metrics = MetricsWriter(0, directory=tmp_path / "m", enable_tensorboard=False)
    base = f"file://{tmp_path}/ckpt"
    cp = ck.Checkpointer(base, 10, metrics, world={"world_size": 1}, config_hash="abc")
    assert cp.due(10) and not cp.due(5)
    t0 = time.perf_counter()
    cp.save(10, model, opt, sched, {"step": 10, "consumed_samples": 80, "tokens": 800}, {"loss": 1.0})
    assert time.perf_counter() - t0 < 0.9  # the step loop did not wait for the 1 s write
    assert not cp.poll()
    assert cp.wait(timeout=30) and cp.poll()
    metrics.close()
    got = events(metrics.path)
    assert ("checkpoint_wait", 10, None) in got  # wait() blocked on the upload, and said so first
    assert [e for e in got if e[0] != "checkpoint_wait"] == [
        ("checkpoint_begin", 10, None),
        ("checkpoint_staged", 10, None),
        ("checkpoint_end", 10, True),
        ("checkpoint_committed", 10, None),
    ]
    # The two sections of a save, as the agent times them: the stall (the loop waited) and the
    # upload beside the steps; the 1 s write is in the upload, not the stall.
    records = {r["event"]: r for r in map(json.loads, metrics.path.read_text().splitlines())}
    staged, end = records["checkpoint_staged"], records["checkpoint_end"]
    assert staged["stall_s"] < 0.9 and end["stall_s"] == staged["stall_s"]
    assert end["upload_s"] >= 1.0 and end["save_s"] == pytest.approx(end["stall_s"] + end["upload_s"])
    assert cp.last_committed == f"{base}/step_00000010"
    written = manifest.read_manifest(cp.last_committed)
    assert written["step"] == 10 and written["tokens"] == 800 and written["config_hash"] == "abc"
    assert manifest.verify(cp.last_committed, deep=True).good
    assert manifest.last_good(base) == cp.last_committed


def test_failed_save_commits_nothing_and_the_next_interval_retries(tmp_path, run_state, monkeypatch):
    model, opt, sched = run_state
    metrics = MetricsWriter(0, directory=tmp_path / "m", enable_tensorboard=False)
    base = f"file://{tmp_path}/ckpt"
    cp = ck.Checkpointer(base, 10, metrics, world={"world_size": 1}, config_hash="abc")
    cp.save(10, model, opt, sched, {"step": 10, "consumed_samples": 80, "tokens": 800})
    assert cp.wait(timeout=30)

    monkeypatch.setattr(ck, "_writer", lambda uri, n: FailingWriter(ck.local_path(uri)))
    cp.save(20, model, opt, sched, {"step": 20, "consumed_samples": 160, "tokens": 1600})  # does not raise
    assert cp.wait(timeout=30)
    assert manifest.read_manifest(f"{base}/step_00000020") is None
    assert manifest.last_good(base) == f"{base}/step_00000010"

    # A failure before any write (the location cannot be created) is reported the same way.
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    monkeypatch.undo()
    cp.base_uri = str(blocker)
    cp.save(30, model, opt, sched, {"step": 30, "consumed_samples": 240, "tokens": 2400})
    assert cp.wait(timeout=30)

    cp.base_uri = base
    cp.save(40, model, opt, sched, {"step": 40, "consumed_samples": 320, "tokens": 3200})
    assert cp.wait(timeout=30)
    metrics.close()
    got = events(metrics.path)
    assert ("checkpoint_end", 20, False) in got and ("checkpoint_committed", 20, None) not in got
    assert ("checkpoint_end", 30, False) in got and ("checkpoint_committed", 30, None) not in got
    assert ("checkpoint_committed", 40, None) in got
    failed = [json.loads(line) for line in metrics.path.read_text().splitlines() if '"ok": false' in line]
    assert "injected" in failed[0]["error"]
    assert manifest.last_good(base) == f"{base}/step_00000040"


def test_load_restores_into_a_fresh_model(tmp_path, run_state):
    model, opt, sched = run_state
    uri = str(tmp_path / "plain-path" / "step_00000001")
    ck.save(uri, model, opt, sched, {"step": 1}, async_=False)
    torch.manual_seed(7)
    model2 = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 8))
    opt2 = torch.optim.AdamW(model2.parameters(), lr=1e-3)
    sched2 = torch.optim.lr_scheduler.LambdaLR(opt2, lambda s: 1.0)
    assert ck.load(uri, model2, opt2, sched2) == {"step": 1}
    for a, b in zip(model.parameters(), model2.parameters()):
        assert torch.equal(a, b)
    assert torch.equal(opt.state_dict()["state"][0]["exp_avg"], opt2.state_dict()["state"][0]["exp_avg"])
