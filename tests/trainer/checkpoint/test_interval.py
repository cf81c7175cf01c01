"""`checkpoint.every_steps: auto`: seconds to steps (Young–Daly), its clamps, the MTBF variable, and
when a rank saves (the first save at `first_after`, then the interval all ranks agreed on)."""

from __future__ import annotations

import math

import pytest

from aerie_contracts import env
from trainer.checkpoint.interval import MIN_STALL_S, YoungDalyInterval, interval_steps, mtbf_from_env


def test_seconds_to_steps_is_young_daly_over_the_step_time():
    # √(2 · 2 s · 3600 s) = 120 s of training: 60 steps of 2 s.
    assert interval_steps(2.0, 2.0, 3600.0) == 60
    assert interval_steps(0.5, 0.3, 20_000.0) == round(math.sqrt(2 * 0.5 * 20_000) / 0.3)


def test_clamps():
    assert interval_steps(0.001, 10.0, 1.0) == 1  # shorter than a step: every step
    assert interval_steps(60.0, 0.01, 1e7, hi=500) == 500  # at most `hi` (the run's length)
    assert interval_steps(0.0, 1.0, 5000.0) == round(math.sqrt(2 * MIN_STALL_S * 5000))  # a measured 0
    # Never shorter than a whole save (stall + upload): a save would wait for the one before.
    assert interval_steps(0.1, 1.0, 3600.0) == round(math.sqrt(720))
    assert interval_steps(0.1, 1.0, 3600.0, save_s=45.2) == 46
    with pytest.raises(ValueError):
        interval_steps(1.0, 0.0, 3600.0)
    with pytest.raises(ValueError):
        interval_steps(1.0, 1.0, -1.0)


def test_the_mtbf_comes_from_the_control_plane():
    assert mtbf_from_env({env.CHECKPOINT_MTBF_S: "5400.5"}) == 5400.5
    for bad in ("", "x", "0", "-3", "inf", "nan"):
        assert mtbf_from_env({env.CHECKPOINT_MTBF_S: bad}) is None
    assert mtbf_from_env({}) is None


def test_first_save_then_the_measured_interval_once_agreed():
    auto = YoungDalyInterval(mtbf_s=3600.0, first_after=10)
    for _ in range(10):
        auto.observe_step(2.0)
    assert [s for s in range(1, 11) if auto.due(s)] == [10]
    assert auto.proposal() == 0  # nothing measured before the first save
    auto.observe_save(10, stall_s=2.0)
    assert auto.proposal() == 60  # √(2·2·3600) / 2
    assert auto.due(20)  # still every 10 until the ranks agreed (the next all-gather)
    assert auto.adopt(75) == 75  # another rank's proposal was larger: everyone takes it
    assert auto.adopt(75) is None  # unchanged
    assert not auto.due(84) and auto.due(85)
    auto.observe_save(85, stall_s=1.0)  # the largest stall seen stays C
    assert auto.proposal() == 60
    auto.observe_upload(300.0)  # a whole save took 300 s: 150 steps at least
    assert auto.proposal() == 150
    assert auto.describe() == {
        "every_steps": 75,
        "interval_s": 150.0,
        "stall_s": 2.0,
        "save_s": 300.0,
        "step_s": 2.0,
        "mtbf_s": 3600.0,
    }


def test_without_an_mtbf_it_keeps_the_first_interval():
    auto = YoungDalyInterval(mtbf_s=None, first_after=100)
    auto.observe_step(1.0)
    auto.observe_save(100, stall_s=3.0)
    assert auto.proposal() == 0 and auto.every == 100 and auto.due(200) and not auto.due(199)
