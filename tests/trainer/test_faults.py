"""The fault injector (trainer/faults.py): the `spike` fault's reported loss is `factor` times
larger from its step on, in the attempt it names only; the CLI form parses its factor; a fault
fires in its own attempt only; a malformed fault is refused with its reason."""

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


def test_a_fault_fires_only_in_the_attempt_it_names():
    """What NaN attribution's end-to-end test relies on (tests/e2e/test_nan_attribution.py): a
    fault of attempt 1 (the default) is gone in attempt 2; one per attempt recurs."""
    once = [{"kind": "nan", "step": 12, "rank": 3}]
    assert injector(3, once).loss_is_nan(12) and not injector(3, once, attempt=2).loss_is_nan(12)
    every = [{"kind": "nan", "step": 12, "attempt": n} for n in (1, 2)]
    assert all(injector(0, every, attempt=n).loss_is_nan(12) for n in (1, 2))
    assert not injector(0, every, attempt=3).loss_is_nan(12)


@pytest.mark.parametrize(
    ("fault", "why"),
    [
        ({"kind": "nan", "step": 12, "attempts": [1]}, "unknown fault option"),
        ({"kind": "nan", "step": 12, "attempt": 0}, "attempt must be a whole number >= 1"),
        ({"kind": "nan", "step": "12"}, "step must be a whole number"),
        ({"kind": "nan", "step": 12, "rank": -1}, "rank must be a whole number >= 0"),
        ({"kind": "nan"}, "needs the step"),
        ({"kind": "slow", "step": 2, "seconds": -1}, "seconds must be a number >= 0"),
        ({"kind": "melt", "step": 2}, "unknown fault kind"),
    ],
)
def test_a_bad_fault_is_refused_with_its_reason(fault, why):
    with pytest.raises(ValueError, match=why):
        injector(0, [fault])
