"""The ranged-GET engine's slicing (pure arithmetic) and parallel_get through the CRT."""

from __future__ import annotations

import itertools
import os

from aerie_s3.ranged import MIN_SLICE, coalesce, equal_slices, parallel_get


def test_equal_slices_keep_every_connection_busy_to_the_end():
    mib = 1 << 20
    pieces = [("a", 0, 10 * mib), ("b", 0, 3 * mib), ("c", 5, 5 + 7 * mib)]
    tasks = equal_slices(pieces, connections=4, max_part=2 * mib)
    sizes = [sum(e - s for _, s, e in t) for t in tasks]
    assert sum(sizes) == 20 * mib
    assert max(sizes) <= 2 * mib
    assert len(tasks) % 4 == 0 or len(tasks) < 4 or sizes[-1] < sizes[0]
    assert len(set(sizes[:-1])) == 1  # equal slices, the last one takes the rest
    # Every byte of every object once, in order, and slices cross object boundaries.
    covered = {}
    for task in tasks:
        for tag, s, e in task:
            covered.setdefault(tag, []).append((s, e))
    for tag, start, end in pieces:
        spans = sorted(covered[tag])
        assert spans[0][0] == start and spans[-1][1] == end
        assert all(a[1] == b[0] for a, b in itertools.pairwise(spans))
    assert any(len({tag for tag, _, _ in t}) > 1 for t in tasks)


def test_small_totals_are_not_cut_below_the_minimum_slice():
    tasks = equal_slices([("x", 0, 100_000), ("y", 0, 50_000)], connections=16, max_part=1 << 20)
    assert len(tasks) == 1 and sum(e - s for _, s, e in tasks[0]) == 150_000 < MIN_SLICE
    assert equal_slices([("x", 0, 0)], connections=4, max_part=1 << 20) == []


def test_many_small_ranges_are_spread_over_every_connection():
    pieces = [(i, 1000 * i, 1000 * i + 300) for i in range(64)]  # FastFile samples, tiny objects
    tasks = equal_slices(pieces, connections=16, max_part=1 << 20)
    assert len(tasks) == 16 and all(len(t) == 4 for t in tasks)


def test_coalesce_merges_across_small_gaps():
    assert coalesce([(100, 10), (0, 50), (60, 20)], max_gap=10) == [(0, 80), (100, 110)]
    assert coalesce([(0, 10), (10, 5)], max_gap=0) == [(0, 15)]


def test_parallel_get_is_ranged_crt_gets_into_one_buffer(s3_env, s3_bucket, s3_server):
    data = os.urandom(3 * (1 << 20) + 17)
    s3_server.client().put_object(Bucket=s3_bucket, Key="blob", Body=data)
    assert parallel_get(f"s3://{s3_bucket}/blob", connections=4, part_size=MIN_SLICE) == data
