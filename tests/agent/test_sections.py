"""Learned section timeouts (issue #19, acceptance 2 and 3), on synthetic traces replayed through
the live code path (`agent.monitor.replay`: the progress probe's parsing of the metrics stream,
the observation windows and every detector), and the hand-over of what was learned from one
attempt to the next (heartbeat summary -> control plane -> `AERIE_SECTIONS` -> agent)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from aerie_contracts.env import SECTIONS
from aerie_contracts.failures import FailureKind
from aerie_contracts.health import SUMMARY_SECTIONS, HealthSettings, Section, compact_learned
from aerie_contracts.metrics import MetricEvent
from agent.config import AgentConfig
from agent.detect import detect_all
from agent.monitor import Observations, replay
from agent.probes.progress import ProgressProbe
from agent.sections import learned_summary, section_limit
from orchestrator.learned import learned_env

HANG = FailureKind.SILENT_HANG.value
STALLED = FailureKind.CHECKPOINT_STALLED.value


def synth(
    seconds: float,
    *,
    step_s: float = 2.0,
    ranks: int = 2,
    first_step_at: float = 5.0,
    hang_at: float | None = None,
    events: list[tuple[float, str]] = (),
    pause: list[tuple[float, float]] = (),
    util: float = 90.0,
) -> list[dict]:
    """One sample per second, as `Monitor.sample` records them: every rank steps every `step_s`
    (not inside `pause` intervals, nor from `hang_at` on, where the accelerators stay busy: a busy
    hang), and logs `events` ([(t, event)] on every rank)."""
    samples, next_step, step = [], first_step_at, 0
    pending = sorted(events)
    for now in range(int(seconds) + 1):
        records = []
        while next_step <= now and (hang_at is None or next_step < hang_at):
            if any(b <= next_step < e for b, e in pause):
                next_step = next(e for b, e in pause if b <= next_step < e)
                continue
            step += 1
            for r in range(ranks):
                records.append({"t": next_step, "rank": r, "step": step, "loss": 3.0, "step_s": step_s, "event": None})
            next_step += step_s
        while pending and pending[0][0] <= now:
            t, event = pending.pop(0)
            records += [{"t": t, "rank": r, "step": step, "event": event} for r in range(ranks)]
        samples.append(
            {
                "now": float(now),
                "accel": {str(r): util for r in range(ranks)},
                "nics": {},
                "records": records,
                "processes": [{"rank": r, "pid": 100 + r, "state": "running", "cpu": util} for r in range(ranks)],
            }
        )
    return samples


def save(t: float, stall: float, upload: float | None) -> list[tuple[float, str]]:
    """A save's events: begin, staged after `stall`, end after `upload` (None: never ends)."""
    out = [(t, MetricEvent.CHECKPOINT_BEGIN.value), (t + stall, MetricEvent.CHECKPOINT_STAGED.value)]
    if upload is not None:
        out.append((t + stall + upload, MetricEvent.CHECKPOINT_END.value))
    return out


def kinds(fired) -> list[str]:
    return [v.kind for _t, v in fired]


def window_after(samples: list[dict], health: dict | None = None, learned: dict | None = None):
    cfg = HealthSettings.from_dict(health or {})
    obs = Observations(ProgressProbe(Path("/nonexistent")), cfg, learned=learned)
    for sample in samples:
        obs.add(sample, ingest_records=True)
    return obs.window(samples[-1]["now"], 0.0), cfg


# ----------------------------------------------------------------------------- step


def test_steps_of_2s_get_a_step_limit_from_their_own_p95():
    """With a 5 s floor the limit is 5 x p95 = 10 s: a busy hang is called 10 s after the last
    step, not sooner; with the default 30 s floor the p95 (2 s) is the evidence but the floor wins."""
    health = {"hang_floor_s": 5.0, "startup_grace_s": 0.0}
    samples = synth(120, hang_at=81.0)  # last step at t=79
    w, cfg = window_after(samples[:80], health)
    assert section_limit(w, cfg, Section.STEP) == (10.0, 2.0)
    fired = replay(samples, health, 0.0)
    assert kinds(fired)[:1] == [HANG]
    t, v = fired[0]
    assert v.evidence["step_time_p95"] == 2.0 and v.evidence["limit_s"] == 10.0
    assert 79 + 10 < t <= 79 + 10 + 1  # within one sample of the limit
    _, v = replay(synth(150, hang_at=81.0), {}, 0.0)[0]
    assert v.evidence["step_time_p95"] == 2.0 and v.evidence["limit_s"] == 30.0


def test_a_restarted_attempt_starts_with_the_learned_values():
    """Attempt 1 learns 8 s steps and 10 s uploads; attempt 2, handed them, judges its first
    upload by the learned 120 s limit (not the cold pause_max_s) and its first steps by 5 x 8 s."""
    one = synth(200, step_s=8.0, events=save(50, 1.0, 10.0) + save(130, 1.0, 10.0))
    w1, cfg = window_after(one)
    learned = json.loads(json.dumps(learned_summary(w1)))  # what its heartbeats carried
    assert learned[Section.CHECKPOINT_UPLOAD.value] == [10.0, 10.0, 10.0, 10.0]  # 2 saves x 2 ranks
    assert set(learned[Section.STEP.value]) == {8.0}

    # Attempt 2: steps of 2 s from t=5, then a save whose upload never ends (steps go on).
    two = synth(400, events=save(40, 1.0, None))
    cold = replay(two, {}, 0.0)
    assert STALLED not in kinds(cold)  # no history: the cold limit (1800 s) applies
    warm = replay(two, {}, 0.0, learned=learned)
    assert kinds(warm) == [STALLED]
    t, v = warm[0]
    assert v.evidence["section"] == Section.CHECKPOINT_UPLOAD.value and v.evidence["limit_s"] == 120.0
    assert 41 + 120 < t <= 41 + 121
    w2, cfg = window_after(two[:10], learned=learned)
    assert section_limit(w2, cfg, Section.STEP)[0] == 40.0  # 5 x the learned 8 s, from its first steps


def test_learned_sections_travel_from_heartbeats_through_the_control_plane_to_the_next_agent(tmp_path):
    one = synth(200, step_s=8.0, events=save(50, 40.0, 10.0))
    w1, _ = window_after(one)
    summary = {SUMMARY_SECTIONS: learned_summary(w1)}
    assert summary[SUMMARY_SECTIONS][Section.CHECKPOINT_STALL.value] == [40.0, 40.0]
    assert summary[SUMMARY_SECTIONS][Section.SETUP.value] == [5.0]
    # The control plane: the newest heartbeat of each node of each earlier attempt.
    job = SimpleNamespace(
        attempts=[
            SimpleNamespace(number=1, nodes=[SimpleNamespace(summary=summary), SimpleNamespace(summary=None)]),
            SimpleNamespace(number=2, nodes=[SimpleNamespace(summary={"sections": "garbage"})]),
        ]
    )
    env = learned_env(job, before=3)
    assert list(env) == [SECTIONS] and len(env[SECTIONS]) < 512  # SageMaker's cap on a value
    assert learned_env(job, before=1) == {}
    # The next agent reads it (and survives a malformed one).
    base = {"AERIE_ENTRYPOINT": '["true"]', "AERIE_ML_ROOT": str(tmp_path), "SM_CURRENT_HOST": "algo-1"}
    assert AgentConfig.from_env({**base, **env}).learned[Section.CHECKPOINT_STALL.value] == [40.0, 40.0]
    assert AgentConfig.from_env({**base, SECTIONS: "{not json"}).learned == {}
    assert AgentConfig.from_env({**base, SECTIONS: '{"step": ["x", -1, 2]}'}).learned == {"step": [2.0]}


def test_the_learned_environment_value_always_fits_sagemakers_cap():
    worst = {s.value: [1234.5678 + i / 7 for i in range(40)] for s in Section}
    job = SimpleNamespace(attempts=[SimpleNamespace(number=1, nodes=[SimpleNamespace(summary={"sections": worst})])])
    text = learned_env(job, before=2)[SECTIONS]
    assert len(text) <= 500 and set(json.loads(text)) == {s.value for s in Section}


def test_compact_learned_keeps_the_tail():
    values = {"step": [float(i) for i in range(1, 101)]}
    got = compact_learned(values)["step"]
    assert len(got) == 9 and got[0] == 69.0 and got[-1] == 100.0  # the newest 32, as quantiles


# ----------------------------------------------------------------------------- checkpoints


def test_40s_checkpoint_stalls_raise_no_false_verdict():
    """Ten minutes of 2 s steps, a save every 60 s that stalls the loop for 40 s (then uploads
    for 10 s beside the steps), an eval pause: the step limit (30 s) is shorter than a stall, yet
    no verdict, with the cold limits at first and the learned ones after."""
    events = [e for t in range(60, 600, 60) for e in save(t, 40.0, 10.0)]
    events += [(545.0, MetricEvent.EVAL_BEGIN.value), (557.0, MetricEvent.EVAL_END.value)]
    pauses = [(t, t + 40.0) for t in range(60, 600, 60)] + [(545.0, 557.0)]
    samples = synth(600, events=events, pause=pauses)
    assert replay(samples, {}, 0.0) == []
    w, cfg = window_after(samples)
    limit, p95 = section_limit(w, cfg, Section.CHECKPOINT_STALL)
    assert p95 == 40.0 and limit == 200.0  # learned: 5 x 40 s
    # ... and a restarted attempt that learned them raises nothing either.
    assert replay(samples, {}, 0.0, learned={Section.CHECKPOINT_STALL.value: [40.0] * 8}) == []


def test_busy_hang_during_an_async_upload_is_caught_within_the_step_limit():
    """The upload of the save at t=100 never ends (a throttled S3); at t=131 a rank busy-hangs.
    The upload is no pause: the hang is called at the step limit (30 s after the last step), not
    after pause_max_s (1800 s) as when any open save suspended detection."""
    samples = synth(400, events=save(100.0, 1.0, None), hang_at=131.0)  # last step at t=129
    fired = replay(samples, {}, 0.0)
    assert kinds(fired)[0] == HANG
    t, v = fired[0]
    assert v.evidence["state"] == "busy" and v.evidence["window"]["uploads"] == {"0": 101.0, "1": 101.0}
    assert t <= 129 + 30 + 1


def test_a_stalled_upload_is_its_own_verdict_while_steps_go_on():
    """Learned uploads of ~10 s; one that runs for over 120 s (max(upload_floor_s, 5 x 10 s)) is
    `checkpoint.stalled` on the upload section; the steps beside it are healthy (no hang)."""
    learned = {Section.CHECKPOINT_UPLOAD.value: [10.0] * 8}
    samples = synth(300, events=save(60.0, 1.0, None))
    fired = replay(samples, {}, 0.0, learned=learned)
    assert kinds(fired) == [STALLED]
    t, v = fired[0]
    assert v.evidence["section"] == Section.CHECKPOINT_UPLOAD.value and "abandoned" in v.message
    assert 61 + 120 < t <= 61 + 121


def test_the_loop_waiting_for_an_upload_is_bounded_by_the_upload_limit():
    """The loop blocks on an in-flight upload (`checkpoint_wait`: the next save, or the end of
    training) for 60 s: no step, no hang; past the upload's limit it is `checkpoint.stalled`."""
    events = save(60.0, 1.0, 70.0) + [(70.0, MetricEvent.CHECKPOINT_WAIT.value)]
    samples = synth(200, events=events, pause=[(70.0, 131.0)])
    assert replay(samples, {}, 0.0) == []
    stuck = synth(400, events=save(60.0, 1.0, None) + [(70.0, MetricEvent.CHECKPOINT_WAIT.value)], pause=[(70, 1e9)])
    fired = replay(stuck, {}, 0.0, learned={Section.CHECKPOINT_UPLOAD.value: [10.0] * 8})
    assert kinds(fired)[0] == STALLED


def test_a_stall_past_its_learned_limit_is_checkpoint_stalled():
    learned = {Section.CHECKPOINT_STALL.value: [5.0] * 8}  # limit max(60, 25) = 60 s
    samples = synth(200, events=[(60.0, MetricEvent.CHECKPOINT_BEGIN.value)], pause=[(60.0, 1e9)])
    fired = replay(samples, {}, 0.0, learned=learned)
    assert kinds(fired)[0] == STALLED
    assert fired[0][1].evidence["section"] == Section.CHECKPOINT_STALL.value


def test_setup_limit_learns_upwards_only():
    samples = synth(30, first_step_at=1e9)  # no step yet
    w, cfg = window_after(samples, learned={Section.SETUP.value: [10.0]})
    assert section_limit(w, cfg, Section.SETUP)[0] == 300.0  # never below first_step_timeout_s
    w, cfg = window_after(samples, learned={Section.SETUP.value: [100.0]})
    assert section_limit(w, cfg, Section.SETUP)[0] == 500.0
    assert detect_all(w, cfg) == []


# ----------------------------------------------------------------------------- stragglers' input


def test_the_probe_reports_each_ranks_compute_and_wait_medians():
    """What the heartbeat's `ranks` carries for the control plane's straggler detector: rank 1
    sleeps 0.3 s a step, so it computes longest and waits least."""
    probe = ProgressProbe(Path("/nonexistent"))
    for step in range(1, 16):
        for rank, compute in ((0, 0.05), (1, 0.35)):
            probe.ingest(
                {"t": step, "rank": rank, "step": step, "loss": 3.0, "step_s": 0.4, "event": None}
                | {"compute_s": compute, "wait_s": 0.4 - compute}
            )
    timing = probe.rank_timing()
    assert timing["1"]["compute_p50"] == 0.35 and timing["0"]["wait_p50"] == 0.35 and timing["0"]["n"] == 10
    probe.ingest({"t": 16, "rank": 1, "step": 16, "loss": float("nan"), "local_loss": float("nan"), "event": None})
    probe.ingest({"t": 17, "rank": 1, "step": 17, "loss": float("nan"), "local_loss": float("nan"), "event": None})
    assert probe.first_nan[1]["step"] == 16 and 0 not in probe.first_nan
    # Each rank's newest step for the API (`rank_steps`): a non-finite loss is null (JSON).
    assert probe.rank_steps() == {"0": {"step": 15, "loss": 3.0, "t": 15}, "1": {"step": 17, "loss": None, "t": 17}}
    # HF's bar of step 16 is read before the step's logs dict (and before the probe's record, which
    # its thread flushes every 0.5 s): the step before it, with its loss, until the loss comes.
    probe.ingest({"t": 18, "rank": 0, "step": 16, "event": None, "source": "log"})
    assert probe.rank_steps()["0"] == {"step": 15, "loss": 3.0, "t": 15}
    probe.ingest({"t": 18.03, "rank": 0, "step": 16, "loss": 2.5, "event": None, "source": "log"})
    assert probe.rank_steps()["0"] == {"step": 16, "loss": 2.5, "t": 18.03}


# ----------------------------------------------------------------------------- wind-down


def test_the_wind_down_after_the_last_step_has_its_own_limit_not_the_steps():
    """After `train_end` (the last step; a BYO trainer's final save is invisible to the agent) a
    quiet node is winding down: no hang at the 12 s step limit; one past `wind_down_floor_s`
    (a rank hung at exit) is a hang that names the open wind-down."""
    health = {"hang_floor_s": 12.0, "startup_grace_s": 0.0, "wind_down_floor_s": 60.0}
    samples = synth(150, hang_at=51.0, events=[(50.0, MetricEvent.TRAIN_END.value)])  # last step at t=49
    fired = replay(samples, health, 0.0)
    assert kinds(fired)[:1] == [HANG]
    t, v = fired[0]
    assert 50 + 60 < t <= 50 + 61, t  # the wind-down's limit from its start, not 49 + 12
    assert "wind_down open for over 60s" in v.message
    w, cfg = window_after(samples[:60], health)
    assert section_limit(w, cfg, Section.WIND_DOWN) == (60.0, None)  # cold: its floor, not pause_max_s


def test_a_step_after_train_end_goes_back_to_the_step_limit():
    """A total that was not the run's (a bar redrawn for a second phase): the next step closes the
    wind-down and an ordinary hang is called at the step limit again."""
    health = {"hang_floor_s": 12.0, "startup_grace_s": 0.0, "wind_down_floor_s": 600.0}
    samples = synth(120, hang_at=71.0, events=[(30.0, MetricEvent.TRAIN_END.value)])  # steps go on to t=69
    t, v = replay(samples, health, 0.0)[0]
    assert v.kind == HANG and 69 + 12 < t <= 69 + 13, t
