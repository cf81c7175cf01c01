"""At its exit an agent removes its memory area only once the control plane says the job ended
(`Supervisor._job_ended`): it asks again while the last attempt's failure is undecided, and keeps
the area for a relaunch."""

from __future__ import annotations

import time
from types import SimpleNamespace

from aerie_contracts.restarts import NextAction
from agent.supervisor import Supervisor


class Answers:
    def __init__(self, *answers):
        self.answers, self.asked, self.enabled = list(answers), 0, True

    def next_attempt(self):
        self.asked += 1
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]


def _ended(reporter, wait_s: float = 5.0) -> tuple[bool, float]:
    node = SimpleNamespace(_job_over=False, reporter=reporter)
    t0 = time.monotonic()
    return Supervisor._job_ended(node, wait_s=wait_s, poll_s=0.01), time.monotonic() - t0  # type: ignore[arg-type]


def test_a_failed_job_is_waited_for_then_its_area_goes():
    wait = {"action": NextAction.WAIT, "why": "no decision yet"}
    reporter = Answers(wait, wait, {"action": NextAction.EXIT, "why": "job Failed"})
    assert _ended(reporter)[0] and reporter.asked == 3


def test_a_relaunch_keeps_the_area_and_an_undecided_job_is_not_waited_for_long():
    relaunch = Answers({"action": NextAction.EXIT, "why": "attempt 3 is not this one's in-place successor"})
    assert not _ended(relaunch)[0] and relaunch.asked == 1
    ended, took = _ended(Answers({"action": NextAction.WAIT, "why": "no decision yet"}), wait_s=0.2)
    assert not ended and took < 2
    assert not _ended(Answers(None))[0]  # the control plane unreachable: the sweep will do
