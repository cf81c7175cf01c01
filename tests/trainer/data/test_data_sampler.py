"""MegatronPretrainingSampler: per-rank slices of each global batch, resumable."""

from __future__ import annotations

import itertools

import pytest

from trainer.data import MegatronPretrainingSampler


def _batches(total, consumed, mbs, rank, dp, drop_last=True):
    return list(MegatronPretrainingSampler(total, consumed, mbs, rank, dp, drop_last=drop_last))


def test_ranks_get_disjoint_slices_of_every_global_batch():
    total, mbs, dp = 103, 4, 3
    per_rank = [_batches(total, 0, mbs, r, dp) for r in range(dp)]
    assert all(len(b) == 103 // 12 for b in per_rank)
    for step, batches in enumerate(zip(*per_rank)):
        assert all(len(b) == mbs for b in batches)
        flat = [i for b in batches for i in b]
        # Rank r's micro-batch is the r-th slice of the step's global batch, in order.
        assert flat == list(range(step * mbs * dp, (step + 1) * mbs * dp))
    seen = [i for b in itertools.chain(*per_rank) for i in b]
    assert len(seen) == len(set(seen))


def test_resume_continues_where_it_stopped():
    total, mbs, dp = 200, 2, 2
    for rank in range(dp):
        full = _batches(total, 0, mbs, rank, dp)
        for steps_done in (0, 1, 7, 20):
            consumed = steps_done * mbs * dp
            resumed = _batches(total, consumed, mbs, rank, dp)
            assert resumed == full[steps_done:]
            assert len(MegatronPretrainingSampler(total, consumed, mbs, rank, dp)) == len(resumed)


def test_last_partial_batch():
    assert _batches(10, 0, 2, 0, 2) == [[0, 1], [4, 5]]
    assert _batches(10, 0, 2, 1, 2) == [[2, 3], [6, 7]]
    # drop_last=False: the short last batch (8, 9) is sliced like the others, as in Megatron.
    assert _batches(10, 0, 2, 0, 2, drop_last=False) == [[0, 1], [4, 5], [8, 9]]
    assert _batches(10, 0, 2, 1, 2, drop_last=False) == [[2, 3], [6, 7]]
    assert _batches(11, 0, 2, 1, 2, drop_last=False)[-1] == [10]
    assert len(MegatronPretrainingSampler(10, 0, 2, 0, 2, drop_last=False)) == 3
    assert len(MegatronPretrainingSampler(10, 0, 2, 1, 2, drop_last=False)) == 2


@pytest.mark.parametrize(
    "args",
    [(0, 0, 1, 0, 1), (10, 10, 1, 0, 1), (10, 0, 0, 0, 1), (10, 0, 1, 2, 2), (10, 0, 1, 0, 0)],
)
def test_bad_arguments(args):
    with pytest.raises(ValueError):
        MegatronPretrainingSampler(*args)
