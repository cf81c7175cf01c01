"""The `spike` fault (trainer/faults.py): the reported loss of the ranks it names is `factor`
times larger from its step on, in the attempt it names only; the CLI form parses its factor."""

from __future__ import annotations

import json

import pytest

from aerie_contracts import env as aerie_env
from trainer.faults import FaultInjector, parse_cli


def injector(rank: int, faults: list[dict], attempt: int = 1) -> FaultInjector:
    return FaultInjector(rank, {aerie_env.FAULTS: json.dumps(faults), aerie_env.ATTEMPT_NUMBER: str(attempt)})


def test_a_spike_scales_the_loss_of_its_rank_from_its_step_on_in_its_attempt():
    faults = [{"kind": "spike", "step": 30, "rank": 1, "factor": 8}]
    assert [injector(1, faults).loss_scale(s) for s in (29, 30, 31)] == [1.0, 8.0, 8.0]
    assert injector(0, faults).loss_scale(30) == 1.0
    assert injector(1, faults, attempt=2).loss_scale(30) == 1.0
    assert injector(2, [{"kind": "spike", "step": 5}]).loss_scale(5) == 10.0  # every rank, default factor


def test_the_cli_form_of_a_spike_and_a_bad_option():
    assert parse_cli("spike@30:factor=4.5") == {"kind": "spike", "step": 30, "factor": 4.5}
    with pytest.raises(ValueError, match="bad fault option"):
        parse_cli("spike@30:scale=4")
