"""The rank process states the contracts name are psutil's own words (plus Aerie's `gone`).

The agent's probe records `psutil.Process.status()` as it is; the hang detector and blame compare
those words with `ProcessState`, so a word psutil has and the enum lacks would never match.
"""

from __future__ import annotations

import psutil

from aerie_contracts.states import STOPPED_PROCESS_STATES, ProcessState


def test_every_psutil_status_is_a_process_state():
    psutil_words = {v for k, v in vars(psutil).items() if k.startswith("STATUS_")}
    assert psutil_words <= ProcessState.values()
    assert ProcessState.values() - psutil_words == {ProcessState.GONE}


def test_a_stopped_zombie_dead_or_gone_rank_cannot_progress():
    assert {"stopped", "zombie", "dead", "gone"} == STOPPED_PROCESS_STATES
