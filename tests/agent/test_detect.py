"""Detectors on synthetic windows: each verdict fires on its fault, at its threshold, and not
in the situations that look like it (start-up, checkpoints, eval, a stopped or spinning peer)."""

from __future__ import annotations

import json
import math

import pytest

from aerie_contracts.health import HealthSettings
from agent.detect import (
    Verdict,
    Window,
    detect_all,
    detect_gpu_idle,
    detect_hang,
    detect_loss_nan,
    detect_loss_spike,
    detect_nic_stall,
)

CFG = HealthSettings()


def make_window(
    now: float,
    *,
    ranks: int = 2,
    step_s: float = 1.0,
    first_step: float = 10.0,
    steps_until: float | None = None,
    started_at: float = 0.0,
    util=lambda i, t: 80.0,
    nic=lambda t: 1e7,
    nic_state: str = "up",
    retrans=lambda t: 0,
    loss=None,
    open_=None,
    pauses=None,
    processes=None,
) -> Window:
    until = now if steps_until is None else steps_until
    steps = {}
    for r in range(ranks):
        series, k, t = [], 1, first_step
        while t <= until:
            series.append([t, k, loss(k) if loss else 3.0 - 0.001 * k, step_s])
            k, t = k + 1, t + step_s
        steps[str(r)] = series
    ts = [now - i for i in range(130, -1, -1) if now - i >= started_at]
    return Window(
        now=now,
        started_at=started_at,
        accel={str(i): [[t, util(i, t)] for t in ts if t >= now - 90] for i in range(ranks)},
        nics={"eth0": [[t, nic(t)] for t in ts]},
        nic_state={"eth0": nic_state},
        retrans=[[t, retrans(t)] for t in ts],
        steps=steps,
        open=open_ or {},
        pauses=pauses or [],
        processes=processes or [{"rank": r, "pid": 100 + r, "state": "sleeping", "cpu": 50.0} for r in range(ranks)],
    )


def kinds(w: Window, cfg: HealthSettings = CFG) -> list[str]:
    return [v.kind for v in detect_all(w, cfg)]


# ----------------------------------------------------------------------------- config


def test_health_config_defaults_overrides_and_unknown_keys():
    assert HealthSettings.from_dict({}) == HealthSettings()
    assert HealthSettings.from_dict(None).hang_floor_s == 30
    cfg = HealthSettings.from_dict({"hang_floor_s": "12", "spike_steps": 5.0, "made_up": 1, "gpu_idle_s": None})
    assert cfg.hang_floor_s == 12.0 and cfg.spike_steps == 5 and isinstance(cfg.spike_steps, int)
    assert cfg.gpu_idle_s == HealthSettings().gpu_idle_s


def test_clean_steady_window_has_no_verdict():
    assert kinds(make_window(300.0)) == []


def test_verdict_evidence_is_strict_json():
    w = make_window(300.0, loss=lambda k: float("nan") if k > 250 else 3.0)
    (v,) = [v for v in detect_all(w, CFG) if v.kind == "loss.nan"]
    json.dumps(v.evidence, allow_nan=False)
    assert "window" in v.evidence
    v2 = Verdict("x", "m", {"a": math.inf, "b": [float("nan")]})
    assert v2.evidence == {"a": "inf", "b": ["nan"]}


# ----------------------------------------------------------------------------- hang


def test_hang_fires_past_floor_and_not_before():
    assert detect_hang(make_window(229.0, steps_until=200.0), CFG) is None
    v = detect_hang(make_window(231.5, steps_until=200.0), CFG)
    assert v is not None and v.kind == "silent.hang"
    assert v.evidence["stalled_s"] > 30 and v.evidence["limit_s"] == 30


def test_hang_threshold_scales_with_p95_step_time():
    w = make_window(400.0, step_s=10.0, steps_until=300.0)  # last step at 300, 10 s steps -> 50 s limit
    assert detect_hang(make_window(345.0, step_s=10.0, steps_until=300.0), CFG) is None
    v = detect_hang(make_window(351.0, step_s=10.0, steps_until=300.0), CFG)
    assert v is not None and v.evidence["limit_s"] == pytest.approx(50.0)
    assert detect_hang(w, CFG) is not None


def test_hang_busy_vs_idle_evidence():
    busy = detect_hang(make_window(260.0, steps_until=200.0, util=lambda i, t: 100.0), CFG)
    assert busy.evidence["state"] == "busy" and busy.evidence["busy"] == ["0", "1"]
    one_spins = detect_hang(
        make_window(260.0, steps_until=200.0, util=lambda i, t: 100.0 if i == 1 or t < 200 else 0.0), CFG
    )
    assert one_spins.evidence["state"] == "busy" and one_spins.evidence["idle"] == ["0"]
    idle = detect_hang(
        make_window(
            260.0, steps_until=200.0, util=lambda i, t: 80.0 if t < 200 else 0.5, nic=lambda t: 1e7 if t < 200 else 0.0
        ),
        CFG,
    )
    assert idle.evidence["state"] == "idle" and "idle" in idle.message
    assert idle.evidence["nic_bps"]["eth0"] == 0.0


def test_hang_busy_is_relative_to_the_util_before_the_stall():
    """On a crowded host a spinning rank gets only part of a core: busy still means 'as busy as
    while training', and a blocked one still drops to nothing."""
    w = make_window(260.0, steps_until=200.0, util=lambda i, t: 30.0 if (t < 200 or i == 1) else 0.5)
    v = detect_hang(w, CFG)
    assert v.evidence["state"] == "busy" and v.evidence["busy"] == ["1"] and v.evidence["idle"] == ["0"]
    assert v.evidence["util_before"] == {"0": 30.0, "1": 30.0}
    w = make_window(260.0, steps_until=200.0, util=lambda i, t: 30.0 if t < 200 else 3.0)
    assert detect_hang(w, CFG).evidence["state"] == "idle"


def test_hang_names_stopped_processes():
    procs = [
        {"rank": 0, "pid": 1, "state": "sleeping", "cpu": 0.0},
        {"rank": 1, "pid": 2, "state": "stopped", "cpu": 0.0},
    ]
    v = detect_hang(make_window(260.0, steps_until=200.0, util=lambda i, t: 0.0, processes=procs), CFG)
    assert v.evidence["stopped"][0]["rank"] == 1 and "stopped" in v.message


def test_hang_uses_the_stalest_rank():
    w = make_window(240.0)
    w.steps["1"] = [s for s in w.steps["1"] if s[0] <= 200.0]  # rank 1 stuck, rank 0 still logs
    assert detect_hang(w, CFG) is not None


def test_no_hang_in_startup_grace():
    w = make_window(50.0, started_at=0.0, first_step=5.0, steps_until=6.0)  # 44 s stall, but t < 60
    assert detect_hang(w, CFG) is None
    assert detect_hang(make_window(70.0, started_at=0.0, first_step=5.0, steps_until=6.0), CFG) is not None


def test_before_first_step_waits_for_first_step_timeout():
    w = make_window(250.0, first_step=1e9)  # no step yet: slow compile / data warm-up
    assert w.steps["0"] == [] and detect_hang(w, CFG) is None
    v = detect_hang(make_window(301.0, first_step=1e9), CFG)
    assert v is not None and v.evidence["last_step"] is None


def test_no_hang_inside_checkpoint_or_eval_window():
    for what in ("checkpoint", "eval"):
        w = make_window(300.0, steps_until=200.0, open_={"0": {what: 201.0}})
        assert detect_hang(w, CFG) is None, what


def test_a_checkpoint_that_never_ends_is_a_hang_after_pause_max_s():
    w = make_window(2000.0, steps_until=100.0, open_={"0": {"checkpoint": 101.0}})
    v = detect_hang(w, CFG)
    assert v is not None and v.evidence["window"]["open"] == {"0": {"checkpoint": 101.0}}
    assert "checkpoint open for over 1800s" in v.message


def test_hang_clock_restarts_after_checkpoint_ends():
    w = make_window(240.0, steps_until=100.0, pauses=[[101.0, 220.0]])
    assert detect_hang(w, CFG) is None  # 20 s since the checkpoint ended
    assert detect_hang(make_window(251.0, steps_until=100.0, pauses=[[101.0, 220.0]]), CFG) is not None


def test_pause_is_excluded_from_step_times_without_step_s():
    w = make_window(330.0, steps_until=300.0, pauses=[[150.0, 250.0]])
    for s in w.steps.values():  # no step_s logged: gaps are used, the checkpoint gap must not count
        for row in s:
            row[3] = None
        s[:] = [row for row in s if not 150.0 < row[0] < 250.0]
    assert detect_hang(w, CFG) is None
    assert detect_hang(make_window(331.0, steps_until=300.0, pauses=[[150.0, 250.0]]), CFG) is not None


# ----------------------------------------------------------------------------- gpu idle


def idle_one(i, t, since=170.0):
    return 0.5 if (i == 1 and t >= since) else 85.0


def test_gpu_idle_fires_when_one_device_idles_while_peers_step():
    v = detect_gpu_idle(make_window(200.0, util=idle_one), CFG)
    assert v is not None and v.evidence["index"] == "1" and v.evidence["peers_median"] == 85.0
    assert kinds(make_window(200.0, util=idle_one)) == ["silent.gpu_idle"]


def test_gpu_idle_needs_the_full_idle_period():
    assert detect_gpu_idle(make_window(185.0, util=idle_one), CFG) is None


def test_gpu_idle_not_when_peers_idle_too_or_single_device():
    assert detect_gpu_idle(make_window(200.0, util=lambda i, t: 0.5), CFG) is None
    assert detect_gpu_idle(make_window(200.0, ranks=1, util=lambda i, t: 0.5), CFG) is None


def test_gpu_idle_leaves_stopped_steps_to_the_hang_detector():
    w = make_window(240.0, steps_until=200.0, util=lambda i, t: idle_one(i, t, since=200.0))
    assert detect_gpu_idle(w, CFG) is None
    assert kinds(w) == ["silent.hang"]


def test_gpu_idle_not_during_grace_checkpoint_or_eval():
    assert detect_gpu_idle(make_window(50.0, util=lambda i, t: idle_one(i, t, since=20.0)), CFG) is None
    assert detect_gpu_idle(make_window(200.0, util=idle_one, open_={"1": {"eval": 175.0}}), CFG) is None
    assert detect_gpu_idle(make_window(200.0, util=idle_one, pauses=[[172.0, 185.0]]), CFG) is None


# ----------------------------------------------------------------------------- nic stall


def collapsed(t, at=175.0):
    return 5e7 if t < at else 1e3


def test_nic_stall_fires_on_link_down():
    w = make_window(200.0, steps_until=176.0, nic=collapsed, nic_state="down", util=lambda i, t: 0.0)
    v = detect_nic_stall(w, CFG)
    assert v is not None and v.evidence["interface"] == "eth0" and v.evidence["link"] == "down"
    assert kinds(w)[0] == "silent.nic_stall"


def test_nic_stall_fires_on_retransmissions_and_on_crawling_steps():
    # A node whose own link is up holds the stall three samples longer (23 s here), not one window.
    w = make_window(199.0, steps_until=176.0, nic=collapsed, retrans=lambda t: int(max(0, t - 175)))
    assert detect_nic_stall(w, CFG) is not None
    crawl = make_window(199.0, steps_until=176.0, nic=collapsed)
    for s in crawl.steps.values():
        s.append([195.0, s[-1][1] + 1, 2.0, 19.0])  # one step got through, 19x slower
    assert detect_nic_stall(crawl, CFG).evidence["current_bps"] == 1e3


def test_a_node_whose_link_is_up_lets_the_node_whose_link_went_down_speak_first():
    """A cut link stalls its peer's NIC as well (retransmissions, no traffic): after one window
    only the node whose own link is down reports, so the attempt's reason names the cause."""
    retrans = lambda t: int(max(0, t - 175))  # noqa: E731
    cut = make_window(196.5, steps_until=176.0, nic=collapsed, nic_state="down", retrans=retrans)
    peer = make_window(196.5, steps_until=176.0, nic=collapsed, retrans=retrans)
    assert detect_nic_stall(cut, CFG) is not None
    assert detect_nic_stall(peer, CFG) is None
    assert detect_nic_stall(make_window(199.0, steps_until=176.0, nic=collapsed, retrans=retrans), CFG) is not None


def test_nic_stall_background_retransmissions_do_not_corroborate():
    steady = make_window(200.0, steps_until=176.0, nic=collapsed, retrans=lambda t: int(t))  # 1/s all along
    assert detect_nic_stall(steady, CFG) is None


def test_nic_stall_needs_network_corroboration():
    # throughput collapses and steps stop, but the link is up and TCP is not retransmitting:
    # a peer stopped sending (that is a hang, which the hang detector reports later)
    assert detect_nic_stall(make_window(200.0, steps_until=176.0, nic=collapsed), CFG) is None


def test_nic_stall_not_when_steps_still_normal():
    assert detect_nic_stall(make_window(200.0, nic=collapsed, nic_state="down"), CFG) is None


def test_nic_stall_not_explained_by_stopped_or_spinning_rank():
    procs = [
        {"rank": 0, "pid": 1, "state": "sleeping", "cpu": 0.0},
        {"rank": 1, "pid": 2, "state": "stopped", "cpu": 0.0},
    ]
    w = make_window(200.0, steps_until=176.0, nic=collapsed, retrans=lambda t: int(t), processes=procs)
    assert detect_nic_stall(w, CFG) is None
    spin = make_window(
        200.0, steps_until=176.0, nic=collapsed, retrans=lambda t: int(t), util=lambda i, t: 100.0 if i == 1 else 0.0
    )
    assert detect_nic_stall(spin, CFG) is None


def test_nic_stall_ignores_quiet_links_and_pauses():
    quiet = make_window(200.0, steps_until=176.0, nic=lambda t: 1e4 if t < 175 else 0.0, nic_state="down")
    assert detect_nic_stall(quiet, CFG) is None
    ckpt = make_window(200.0, steps_until=176.0, nic=collapsed, nic_state="down", open_={"0": {"checkpoint": 177.0}})
    assert detect_nic_stall(ckpt, CFG) is None
    just_after = make_window(
        200.0, steps_until=176.0, nic=collapsed, retrans=lambda t: int(max(0, t - 175)), pauses=[[177.0, 195.0]]
    )
    assert detect_nic_stall(just_after, CFG) is None


# ----------------------------------------------------------------------------- loss


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), "nan", "-inf"])
def test_loss_nan_fires_on_non_finite(bad):
    w = make_window(100.0, loss=lambda k: bad if k == 80 else 3.0)
    v = detect_loss_nan(w, CFG)
    assert v is not None and v.evidence["step"] == 80


def test_loss_nan_ignores_missing_loss():
    assert detect_loss_nan(make_window(100.0, loss=lambda k: None), CFG) is None


def noisy(k: int) -> float:
    return 3.0 * math.exp(-k / 100) + 2.0 + 0.02 * math.sin(k * 1.7)


def test_loss_spike_fires_when_held_for_spike_steps():
    w = make_window(100.0, loss=lambda k: noisy(k) * (3 if k >= 89 else 1))  # steps 89..91 spike
    v = detect_loss_spike(w, CFG)
    assert v is not None and v.evidence["steps"] == [89, 90, 91] and min(v.evidence["z"]) > 6


def test_loss_spike_not_for_a_blip_or_early_descent():
    blip = make_window(100.0, loss=lambda k: noisy(k) * (3 if k in (88, 90) else 1))
    assert detect_loss_spike(blip, CFG) is None
    assert detect_loss_spike(make_window(100.0, loss=noisy), CFG) is None
    early = make_window(25.0, loss=lambda k: noisy(k) * (3 if k >= 13 else 1))  # < spike_min_baseline steps
    assert detect_loss_spike(early, CFG) is None


def test_loss_spike_with_flat_loss_uses_a_relative_scale():
    assert detect_loss_spike(make_window(100.0, loss=lambda k: 2.0), CFG) is None
    assert detect_loss_spike(make_window(100.0, loss=lambda k: 2.5 if k >= 88 else 2.0), CFG) is not None


def test_loss_spike_ignores_a_small_bump_on_a_very_quiet_loss():
    quiet = lambda k: 2.0 + 0.0005 * math.sin(k)  # noqa: E731 - MAD ~0.0003: a 1 % bump is z ~ 40
    assert detect_loss_spike(make_window(100.0, loss=lambda k: quiet(k) + (0.02 if k >= 89 else 0)), CFG) is None
    assert detect_loss_spike(make_window(100.0, loss=lambda k: quiet(k) + (0.5 if k >= 89 else 0)), CFG) is not None


def test_window_round_trips_through_json():
    w = make_window(200.0, util=idle_one)
    w2 = Window.from_dict(json.loads(json.dumps(w.to_dict())))
    assert w2 == w and kinds(w2) == kinds(w)


def test_loss_nan_names_the_ranks_that_produced_it_and_the_samples():
    """Issue #19 (NaN attribution): every rank logs the combined, non-finite loss, but only the rank
    whose own loss (`local_loss`, before the combine) was non-finite produced it."""
    w = make_window(200.0, loss=lambda k: float("nan") if k >= 150 else 3.0)
    w.nan_records = {
        "0": {"step": 150, "loss": math.nan, "local_loss": 2.9, "consumed_samples": 2400},
        "1": {"step": 150, "loss": math.nan, "local_loss": math.nan, "consumed_samples": 2400},
    }
    v = detect_loss_nan(w, CFG)
    assert v.evidence["step"] == 150 and v.evidence["origin_ranks"] == ["1"]
    assert v.evidence["consumed_samples"] == 2400
    json.dumps(v.evidence, allow_nan=False)


def test_a_stopped_rank_is_a_hang_on_the_learned_limit_not_the_floor():
    """SIGSTOP (the kernel's `stopped`, not a tracing stop) is certain: max(stopped_floor_s 10 s,
    5 x p95) instead of hang_floor_s' 30 s; a tracing stop (py-spy, a debugger) keeps the floor."""
    stopped = [{"rank": 0, "pid": 1, "state": "sleeping", "cpu": 0.0}, {"rank": 1, "pid": 2, "state": "stopped"}]
    quiet = lambda i, t: 0.0  # noqa: E731
    assert detect_hang(make_window(209.0, steps_until=200.0, util=quiet, processes=stopped), CFG) is None
    v = detect_hang(make_window(211.0, steps_until=200.0, util=quiet, processes=stopped), CFG)
    assert v is not None and v.evidence["limit_s"] == 10 and v.evidence["stopped"][0]["rank"] == 1
    slow = make_window(330.0, step_s=4.0, steps_until=300.0, util=quiet, processes=stopped)  # 5 x 4 s = 20 s
    assert detect_hang(slow, CFG) is not None and detect_hang(slow, CFG).evidence["limit_s"] == pytest.approx(20.0)
    assert detect_hang(make_window(318.0, step_s=4.0, steps_until=300.0, util=quiet, processes=stopped), CFG) is None
    traced = [{"rank": 1, "pid": 2, "state": "tracing-stop", "cpu": 0.0}]
    assert detect_hang(make_window(211.0, steps_until=200.0, util=quiet, processes=traced), CFG) is None
