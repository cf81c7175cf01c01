"""The in-memory tier, trainer side: a snapshot in shared memory and back is bit-exact; a torn or
corrupt one is refused; the `auto` interval keeps the measured cost within its budget."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest
import torch

from aerie_contracts import memckpt
from tests.helpers.state_worker import run_two_ranks
from trainer.checkpoint import interval, memory, memory_file, memory_staging

# Run by torchrun on 2 ranks: train, snapshot into the shared-memory area, train on, load the
# snapshot into a model built from another seed, and compare everything with the state at snapshot.
WORKER = r"""
import sys
import torch
torch.set_num_threads(1)
from trainer import parallel
from trainer.checkpoint import memory, memory_file
from tests.helpers.state_worker import (
    EXTRA, draws, finish, full, make, restored, same, seed_rank, train,
)

root, parallelism, out = sys.argv[1], sys.argv[2], sys.argv[3]
world = parallel.init_distributed()

seed_rank(world.rank)
model, opt, sched = make(world, parallelism, 0)
train(model, opt, sched, 3)
expected, expected_sched = full(model, opt), sched.state_dict()
snap = memory.MemorySnapshotter(job="job-a", attempt=1, rank=world.rank, every=3, root=root)
assert snap.due(3) and not snap.due(4)
assert snap.maybe_snapshot(3, model, opt, sched, EXTRA) is None  # staged; written in the background
before = draws()
train(model, opt, sched, 2)  # training goes on (the write may too): must not leak into the snapshot
expected_after = full(model, opt)[0]
(written,) = snap.close()
header = written.header

model2, opt2, sched2 = make(world, parallelism, 1)
train(model2, opt2, sched2, 1)
assert not same(full(model2, opt2)[0], expected[0])
got_header, got_extra = memory_file.load_snapshot(snap.path(3), model2, opt2, sched2)
result = restored(model2, opt2, sched2, got_extra, expected, expected_sched, before)
result["header"] = got_header == header and (header.job, header.attempt, header.step, header.rank) == (
    "job-a", 1, 3, world.rank
)
# Both continue identically after the restore.
train(model2, opt2, sched2, 2)
result["continues"] = same(full(model2, opt2)[0], expected_after)
finish(out, world.rank, result)
"""


@pytest.fixture
def shm_root(tmp_path):
    """A private area in /dev/shm (the tier's home) where there is one, else the test's tmp dir."""
    import shutil
    import tempfile

    root = Path(tempfile.mkdtemp(prefix="aerie-test-", dir="/dev/shm")) if Path("/dev/shm").is_dir() else tmp_path
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.mark.parametrize("parallelism", ["fsdp2"])  # sharded state; plain tensors: the test below
def test_snapshot_round_trip_is_bit_exact(tmp_path, shm_root, parallelism):
    for rank, result in enumerate(run_two_ranks(tmp_path, WORKER, str(shm_root), parallelism)):
        assert result == dict.fromkeys(("model", "optim", "scheduler", "rng", "extra", "header", "continues"), True)
        # The snapshot is a complete, verified file of the shared-memory area.
        path = memckpt.local_dir(shm_root, "job-a") / memckpt.file_name(3, rank)
        assert memckpt.verify(path).rank == rank


def test_plain_model_round_trip_in_process(shm_root):
    """Unsharded state (DDP's, or a single process) through shared memory and back, bit-exact."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.Linear(32, 8))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (s + 1))
    for _ in range(3):
        model(torch.randn(4, 32)).sum().backward()
        opt.step(), sched.step(), opt.zero_grad()
    snap = memory.MemorySnapshotter(job="j", attempt=2, rank=0, every=1, root=shm_root)
    snap.snapshot(3, model, opt, sched, {"step": 3, "consumed_samples": 12})
    expected = (
        {k: v.clone() for k, v in model.state_dict().items()},
        copy.deepcopy(opt.state_dict()),
        sched.state_dict(),
    )
    draws = torch.rand(5)
    torch.manual_seed(7)
    model(torch.randn(4, 32)).sum().backward()  # the step loop goes on while the snapshot is written
    opt.step(), sched.step(), opt.zero_grad()
    assert [w.step for w in snap.close()] == [3]

    torch.manual_seed(1)
    model2 = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.Linear(32, 8))
    opt2 = torch.optim.AdamW(model2.parameters(), lr=1e-2)
    sched2 = torch.optim.lr_scheduler.LambdaLR(opt2, lambda s: 1.0 / (s + 1))
    header, extra = memory_file.load_snapshot(snap.path(3), model2, opt2, sched2)
    assert (header.step, extra) == (3, {"step": 3, "consumed_samples": 12})
    assert all(torch.equal(v, model2.state_dict()[k]) for k, v in expected[0].items())
    got = opt2.state_dict()
    assert got["param_groups"] == expected[1]["param_groups"]
    for index, state in expected[1]["state"].items():
        assert all(torch.equal(t, got["state"][index][name]) for name, t in state.items())
    assert sched2.state_dict() == expected[2]
    assert torch.equal(torch.rand(5), draws)  # the RNG too


def _state() -> dict:
    torch.manual_seed(0)
    return {"w": torch.randn(64, 64), "train_state": b"x"}


def test_torn_snapshot_is_refused(tmp_path):
    """A writer that died before the header (the header block is still zeros), or mid-header."""
    path = tmp_path / memckpt.file_name(5, 0)
    memory_file.write_snapshot(path, _state(), job="j", attempt=1, step=5, rank=0)
    data = bytearray(path.read_bytes())
    path.write_bytes(bytes(memckpt.HEADER_SIZE) + data[memckpt.HEADER_SIZE :])
    with pytest.raises(memckpt.TornSnapshot):
        memory_file.read_snapshot(path)
    path.write_bytes(data[:40] + bytes(memckpt.HEADER_SIZE - 40) + data[memckpt.HEADER_SIZE :])
    with pytest.raises(memckpt.TornSnapshot):
        memory_file.read_snapshot(path)
    path.write_bytes(data[: len(data) - 10])  # header written, payload cut short (a torn copy)
    with pytest.raises(memckpt.TornSnapshot):
        memory_file.read_snapshot(path)


def test_flipped_byte_is_detected(tmp_path):
    path = tmp_path / memckpt.file_name(5, 0)
    header = memory_file.write_snapshot(path, _state(), job="j", attempt=1, step=5, rank=0)
    assert memory_file.read_snapshot(path)[0] == header
    data = bytearray(path.read_bytes())
    data[memckpt.HEADER_SIZE + header.size // 2] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(memckpt.CorruptSnapshot):
        memory_file.read_snapshot(path)


def test_a_rank_keeps_its_newest_snapshots_and_the_one_its_agent_protects(tmp_path):
    """The agent owns pruning (it keeps the job's newest good step); the rank only bounds what an
    agent that takes nothing would leave, and never drops the step the agent protects."""
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.AdamW(model.parameters())
    snap = memory.MemorySnapshotter(job="j", attempt=1, rank=3, every=1, root=tmp_path)
    for step in range(1, 10):
        snap.snapshot(step, model, opt, None, {"step": step})
        if step == 2:
            snap.wait()
            memckpt.write_keep(snap.dir, 2)  # the agent: step 2 is the job's newest good one
    assert [w.step for w in snap.close()] == list(range(1, 10))
    names = sorted(p.name for p in snap.dir.iterdir() if memckpt.parse_name(p.name))
    assert memory.KEEP_OWN == memckpt.MAX_HELD + 1 == 4
    assert names == [memckpt.file_name(s, 3) for s in (2, 6, 7, 8, 9)]


def test_auto_interval_keeps_the_cost_within_budget():
    auto = interval.AutoInterval(budget=0.01, first_after=2)
    assert not auto.due(1) and auto.due(2)  # the first snapshot measures the cost
    auto.observe_step(0.4)
    auto.observe_step(0.6)
    auto.observe_snapshot(2, 0.2)  # this rank's own mean step time: 0.5 s
    assert auto.every() == 40  # 0.2 s per snapshot, 0.5 s per step: every 40 steps is 1 %
    assert not auto.due(41) and auto.due(42)
    for _ in range(40):
        auto.observe_step(5.0)  # steps got slower: at the next snapshot the interval shrinks
    assert auto.due(42) and auto.every() == 40  # not before it: ranks change only together
    auto.observe_snapshot(42, 0.2, step_s=5.0)  # the values the ranks agreed on
    assert auto.every() == 11  # EMA: step 0.5 -> 1.85 s; 0.2 / (0.01 * 1.85) = 10.8
    cheap = interval.AutoInterval(budget=0.01, first_after=1)
    cheap.observe_snapshot(1, 0.01, step_s=10.0)
    assert cheap.every() == 1


def test_auto_mode_ranks_agree_through_the_group(shm_root):
    """A world of one over gloo: the snapshot all-reduces (cost, step time) and re-derives."""
    import socket

    import torch.distributed as dist

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        model = torch.nn.Linear(8, 8)
        opt = torch.optim.AdamW(model.parameters())
        snap = memory.MemorySnapshotter(job="j", attempt=1, rank=0, every=None, root=shm_root)
        assert snap.auto is not None and not snap.due(1)
        snap.observe_step(1.0)
        snap.observe_step(1.0)
        assert snap.maybe_snapshot(2, model, opt, None, {"step": 2}, group=dist.group.WORLD) is None
        (written,) = snap.close()
        assert written.header.step == 2
        # The agreed values: a tiny state's cost against 1 s steps.
        assert snap.auto.step_s == 1.0 and snap.auto.snapshot_s is not None
        assert snap.auto.every() == max(1, math.ceil(snap.auto.snapshot_s / 0.01))
    finally:
        dist.destroy_process_group()


def test_a_background_write_is_the_same_snapshot_as_a_blocking_one(tmp_path):
    """Staged and written in the background, or written in the step loop: the same state bit for
    bit (tied weights stay one tensor), so a resume from either is the same."""
    torch.manual_seed(0)
    embed = torch.nn.Embedding(50, 16)
    head = torch.nn.Linear(16, 50, bias=False)
    head.weight = embed.weight  # tied, as a language model's
    model = torch.nn.Sequential(embed, torch.nn.Linear(16, 16), head)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randint(0, 50, (4, 8))).sum().backward()
    opt.step()
    written = {}
    for mode in (True, False):
        snap = memory.MemorySnapshotter(job="j", attempt=1, rank=0, every=1, root=tmp_path / str(mode), async_=mode)
        torch.manual_seed(3)
        header = snap.snapshot(4, model, opt, None, {"step": 4})
        assert (header is None) == mode
        (written[mode],) = snap.close()
    (_, background), (_, blocking) = (memory_file.read_snapshot(written[m].path) for m in (True, False))

    def same(a, b) -> bool:
        if isinstance(a, torch.Tensor):
            return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
        if isinstance(a, dict):
            return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
        if isinstance(a, (list, tuple)):
            return isinstance(b, (list, tuple)) and len(a) == len(b) and all(map(same, a, b))
        return a == b

    assert same(background, blocking)
    model_state = background["model"]
    assert model_state["0.weight"].data_ptr() == model_state["2.weight"].data_ptr()  # still tied
    staging = memory_staging.Staging()
    staged = staging.copy({"a": embed.weight, "b": head.weight, "groups": [{"lr": 0.1}]})
    assert staged["a"] is staged["b"] and staged["a"].data_ptr() != embed.weight.data_ptr()
    again = staging.copy({"a": embed.weight, "b": head.weight, "groups": [{"lr": 0.1}]})
    assert again["a"] is staged["a"]  # the buffers are reused from one snapshot to the next


@pytest.mark.parametrize("value,every", [("", 0), ("0", 0), ("25", 25), ("auto", None), (" AUTO ", None)])
def test_every_setting(value, every):
    assert interval.parse_every(value) == every


@pytest.mark.parametrize("value", ["-1", "often", "1.5"])
def test_every_setting_refuses_nonsense(value):
    with pytest.raises(ValueError):
        interval.parse_every(value)


def test_the_cached_state_is_the_full_walks_and_follows_a_changed_layout():
    """`StateCache` (no `get_state_dict` walk after the first snapshot) gives the same dict as
    `dcp.state_to_save` as training and the scheduler move on, and walks again when the
    optimizer's state tensors are replaced."""
    from trainer.checkpoint import dcp

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.LayerNorm(8), torch.nn.Linear(8, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    cache = memory_staging.StateCache()

    def train() -> None:
        model(torch.randn(3, 4)).square().mean().backward()
        opt.step()
        opt.zero_grad()
        sched.step()

    def same(a, b) -> None:
        if isinstance(a, torch.Tensor):
            assert isinstance(b, torch.Tensor) and torch.equal(a, b) and a.dtype == b.dtype
        elif isinstance(a, dict):
            assert isinstance(b, dict) and set(a) == set(b)
            for k in a:
                same(a[k], b[k])
        elif isinstance(a, (list, tuple)):
            assert len(a) == len(b)
            for x, y in zip(a, b, strict=True):
                same(x, y)
        else:
            assert a == b

    for i in range(4):
        train()
        rng = torch.get_rng_state()
        cached = copy.deepcopy(cache.state(model, opt, sched, {"step": i}))
        torch.set_rng_state(rng)
        same(cached, dcp.state_to_save(model, opt, sched, {"step": i}))
    assert cache._key is not None
    opt.state[next(iter(opt.state))]["exp_avg"] = torch.zeros(8, 4)  # replaced, not updated in place
    key = cache._key
    cache.state(model, opt, sched, {"step": 9})
    assert cache._key != key
