"""Issue 33, acceptance 3, as traces: no false verdict in clean runs of the three kinds of job that
pause for long without a step, each at three step times ("three runs each"), with the default
health settings, replayed through the live code path (`agent.monitor.replay`: the progress
probe's parsing of the metrics stream, the observation windows and every detector; the clock is
the trace's).

The events are the ones the in-process probe writes for these pauses (`agent/inproc`): an
evaluation is forwards with no backward (`eval_begin`, then `eval_end` when training resumes), a
`torch.save` is a checkpoint section (`checkpoint_begin`/`checkpoint_end`), and a resumed
Lightning epoch is probe steps from the first optimizer step on (its Rich bar, in a pipe, prints
nothing until the epoch ends). Each pause's end is seen a little late, as the agent reads the
stream on its next tick. Whole jobs with these pauses (60 s, 45 s, epochs of minutes) would cost
the suite several minutes each; the real processes' events are tested in tests/agent/inproc.
"""

from __future__ import annotations

import pytest

from aerie_contracts.metrics import MetricEvent
from agent.monitor import replay
from tests.agent.test_sections import kinds, synth

STEP_TIMES = (0.5, 1.0, 2.0)
SEEN_LATE_S = 0.9  # a pause's end reaches the agent at its next tick


@pytest.mark.parametrize("step_s", STEP_TIMES)
def test_an_hf_job_with_a_60_second_evaluation_every_50_steps(step_s):
    events, pauses, begin = [], [], 5.0
    for _ in range(3):
        begin += 50 * step_s
        end = begin + 60 + SEEN_LATE_S
        events += [(begin, MetricEvent.EVAL_BEGIN.value), (end, MetricEvent.EVAL_END.value)]
        pauses.append((begin, end))
        begin = end
    samples = synth(begin + 50 * step_s + 30, step_s=step_s, events=events, pause=pauses)
    assert kinds(replay(samples, {}, 0.0)) == []


@pytest.mark.parametrize("step_s", STEP_TIMES)
def test_a_trainer_that_saves_synchronously_with_torch_save_for_45_seconds(step_s):
    events, pauses, begin = [], [], 5.0
    for _ in range(2):
        begin += 30 * step_s
        end = begin + 45 + SEEN_LATE_S
        events += [(begin, MetricEvent.CHECKPOINT_BEGIN.value), (end, MetricEvent.CHECKPOINT_END.value)]
        pauses.append((begin, end))
        begin = end
    samples = synth(begin + 30 * step_s + 30, step_s=step_s, events=events, pause=pauses)
    assert kinds(replay(samples, {}, 0.0)) == []


@pytest.mark.parametrize("step_s", STEP_TIMES)
def test_a_lightning_job_resumed_mid_epoch_with_an_epoch_longer_than_the_first_step_timeout(step_s):
    # The resumed attempt restores for 20 s, then the probe counts every optimizer step; the
    # epoch (and the bar's one frame) ends after 400 s, far past first_step_timeout_s.
    health = {"first_step_timeout_s": 60.0}
    samples = synth(420, step_s=step_s, first_step_at=20.0)
    assert kinds(replay(samples, health, 0.0)) == []


def test_the_same_gaps_without_the_probes_events_are_hangs():
    """The control: what keeps the runs above clean is the pauses' events (and the first step seen
    early), not a limit too loose to see a 60-s gap."""
    assert kinds(replay(synth(200, step_s=0.5, pause=[(30.0, 91.0)]), {}, 0.0)) == ["silent.hang"]
    late_first_step = synth(420, step_s=0.5, first_step_at=400.0)
    assert kinds(replay(late_first_step, {"first_step_timeout_s": 60.0}, 0.0)) == ["silent.hang"]
