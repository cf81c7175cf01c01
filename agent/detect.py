"""Silent-failure detectors: pure functions over one sample window.

Every detector takes a :class:`Window` (what the probes saw over the last minutes, already
JSON-shaped so recorded traces replay byte for byte) and the job's :class:`~aerie_contracts.health.HealthSettings`, and
returns a :class:`Verdict` or ``None``. Nothing here reads files, clocks or processes, so the
same code runs live in the agent, in trace replays and in synthetic unit tests.

Verdicts are kept disjoint on purpose, so that a fault gets one name:

* ``silent.hang``: no step for too long. Evidence ``state`` is ``"busy"`` when some accelerator
  still works (a collective or a kernel spinning) and ``"idle"`` when all are quiet (a stopped
  or blocked process). With a rank the kernel shows stopped (SIGSTOP) the limit is the learned
  one, ``max(stopped_floor_s, hang_factor x p95)``, not ``hang_floor_s`` (sized for saves and
  evaluations the agent may not see; a stopped process is neither).
* ``silent.gpu_idle``: one accelerator idle for ``gpu_idle_s`` while its peers work *and steps
  still complete* (a wasted device); once steps stop it is the hang detector's case.
* ``silent.nic_stall``: a NIC's throughput collapses against its own recent median while steps
  slow, corroborated by the network itself (link down, TCP retransmissions, or steps that
  still crawl); a collapse explained by a stopped or busy-spinning rank is left to the hang.
* ``loss.nan`` / ``loss.spike``: non-finite loss; a robust (median/MAD) z-score held for
  ``spike_steps`` steps.
* ``checkpoint.stalled``: a save's synchronous part or its asynchronous upload open past its
  section's learned limit (agent/sections.py). An upload is not a pause: the step-hang detector
  keeps running beside it, so a rank that hangs mid-upload is caught at the step limit.

Every limit is a section's (agent/sections.py): learned from this job's history, previous
attempts included.
"""

from __future__ import annotations

import math
from statistics import median

from aerie_contracts import FailureKind
from aerie_contracts.health import HealthSettings, Section
from aerie_contracts.states import STOPPED_PROCESS_STATES, ProcessState
from agent.probes.progress import CHECKPOINT, EVAL, UPLOAD_WAIT, WIND_DOWN
from agent.sections import detect_checkpoint_stalled, section_limit
from agent.window import (
    Verdict,
    Window,
    jsonable,
    percentile,
    step_times,
)
from agent.window import as_loss as _as_loss
from agent.window import finite as _finite
from agent.window import last_pause_end as _last_pause_end
from agent.window import last_step_ts as _last_step_ts
from agent.window import since as _since
from agent.window import window_evidence as _window_evidence

__all__ = ["DETECTORS", "HealthSettings", "Verdict", "Window", "detect_all", "jsonable", "percentile", "step_times"]

# ----------------------------------------------------------------------------- config


# The job spec's `health` section is `aerie_contracts.health.HealthSettings`, one type for the spec
# (orchestrator/spec.py validates it with a model generated from it) and the agent.


# ----------------------------------------------------------------------------- helpers


_PAUSE_SECTIONS = {
    CHECKPOINT: Section.CHECKPOINT_STALL,
    EVAL: Section.EVAL,
    UPLOAD_WAIT: Section.CHECKPOINT_UPLOAD,  # the loop blocked on an upload: the upload's limit
    WIND_DOWN: Section.WIND_DOWN,  # after the last step: a final save and the teardown
}


def _pause_limits(w: Window, cfg: HealthSettings) -> dict[str, float]:
    return {what: section_limit(w, cfg, section)[0] for what, section in _PAUSE_SECTIONS.items()}


def _in_pause(w: Window, cfg: HealthSettings) -> bool:
    """Inside a checkpoint stall or an eval (of any rank) that has not run past its learned limit.
    An asynchronous upload is not a pause: steps run beside it, so step-hang detection goes on."""
    limits = _pause_limits(w, cfg)
    return any(w.now - t0 <= limits.get(what, cfg.pause_max_s) for o in w.open.values() for what, t0 in o.items())


def _in_grace(w: Window, cfg: HealthSettings) -> bool:
    return w.now - w.started_at < cfg.startup_grace_s


def _stopped_processes(w: Window) -> list[dict]:
    return [p for p in w.processes if p.get("state") in STOPPED_PROCESS_STATES]


def _sigstopped(w: Window) -> bool:
    """A rank the kernel shows stopped (SIGSTOP/SIGTSTP; not a debugger's or py-spy's tracing stop)."""
    return any(p.get("state") == ProcessState.STOPPED for p in w.processes)


def _median_util(w: Window, t0: float, t1: float = math.inf) -> dict[str, float]:
    out = {}
    for idx, series in w.accel.items():
        vals = [u for t, u in series if t0 <= t <= t1]
        if vals:
            out[idx] = median(vals)
    return out


def _nic_rates(w: Window, t0: float) -> dict[str, float]:
    return {name: median([b for _t, b in _since(s, t0)]) for name, s in w.nics.items() if _since(s, t0)}


def hang_threshold(w: Window, cfg: HealthSettings) -> tuple[float, float | None]:
    """The step section's limit: max(hang_floor_s, hang_factor x p95 step time, learned included)."""
    return section_limit(w, cfg, Section.STEP)


# ----------------------------------------------------------------------------- detectors


def detect_hang(w: Window, cfg: HealthSettings) -> Verdict | None:
    if _in_grace(w, cfg) or _in_pause(w, cfg):
        return None
    last = _last_step_ts(w)
    if not last:  # before the first step: start-up (compile, rendezvous, data) is allowed longer
        since = w.started_at
        limit, p95 = section_limit(w, cfg, Section.SETUP)
    else:
        limit, p95 = hang_threshold(w, cfg)
        if _sigstopped(w):  # certain: the learned limit, not a floor sized for invisible saves
            limit = min(limit, max(cfg.stopped_floor_s, cfg.hang_factor * p95 if p95 is not None else 0.0))
        since = min(last.values())  # the stalest rank: collectives wait for the slowest
    since = max(since, _last_pause_end(w))  # a checkpoint/eval that just ended restarts the clock
    stalled = w.now - since
    if stalled <= limit:
        return None
    look = max(since, w.now - 30.0)
    utils = _median_util(w, look)
    before = _median_util(w, since - 30.0, since)
    # Busy = still working as hard as while training (or past busy_util): on a shared host a
    # spinning rank may get far less than a whole core, but it does not drop to nothing.
    busy = sorted(
        i for i, u in utils.items() if u >= max(cfg.gpu_idle_util, min(cfg.busy_util, 0.5 * before.get(i, math.inf)))
    )
    idle = sorted(i for i, u in utils.items() if u < cfg.gpu_idle_util)
    state = "busy" if busy else "idle"
    stopped = _stopped_processes(w)
    stalest = min(last, key=last.get) if last else None
    last_step = w.steps[stalest][-1][1] if stalest is not None else None
    why = (
        "accelerators busy while no step completes (hung collective or spinning kernel)"
        if state == "busy"
        else "accelerators idle (stalled or blocked process)"
    )
    if stopped:
        why += f"; stopped/gone: ranks {[p.get('rank') for p in stopped]}"
    stuck = sorted({what for opened in w.open.values() for what in opened})
    if stuck:
        limits = _pause_limits(w, cfg)
        why += "; " + ", ".join(f"{what} open for over {limits.get(what, cfg.pause_max_s):.0f}s" for what in stuck)
    return Verdict(
        FailureKind.SILENT_HANG,
        f"no step for {stalled:.0f}s (limit {limit:.0f}s, last step {last_step}); {why}",
        {
            "state": state,
            "stalled_s": round(stalled, 3),
            "limit_s": round(limit, 3),
            "step_time_p95": p95,
            "last_step": last_step,
            "stalest_rank": stalest,
            "util": utils,
            "util_before": before,
            "busy": busy,
            "idle": idle,
            "nic_bps": _nic_rates(w, look),
            "stopped": stopped,
            "window": _window_evidence(w, 60.0),
        },
    )


def detect_gpu_idle(w: Window, cfg: HealthSettings) -> Verdict | None:
    if _in_grace(w, cfg) or _in_pause(w, cfg) or len(w.accel) < 2:
        return None
    t0 = w.now - cfg.gpu_idle_s
    if any(b <= w.now and e >= t0 for b, e in w.pauses):
        return None  # only rank 0 works during a checkpoint or eval
    if not any(t >= t0 for t in _last_step_ts(w).values()):
        return None  # steps stopped: that is a hang, reported with idle/busy evidence there
    covered = {i: s for i, s in w.accel.items() if s and s[0][0] <= t0 + cfg.sample_s}
    for idx, series in covered.items():
        recent = [u for _t, u in _since(series, t0)]
        if not recent or max(recent) >= cfg.gpu_idle_util:
            continue
        peers = [u for j, s in w.accel.items() if j != idx for _t, u in _since(s, t0)]
        if peers and median(peers) >= cfg.gpu_work_util:
            return Verdict(
                FailureKind.SILENT_GPU_IDLE,
                f"accelerator {idx} below {cfg.gpu_idle_util:g}% for {cfg.gpu_idle_s:g}s "
                f"while its peers work (median {median(peers):.0f}%)",
                {
                    "index": idx,
                    "util": max(recent),
                    "peers_median": median(peers),
                    "window": _window_evidence(w, cfg.gpu_idle_s + 10),
                },
            )
    return None


def _retrans_rates(w: Window, t_recent: float) -> tuple[float, float]:
    """TCP retransmissions during the recent window, and the background rate per second before it
    (on a shared namespace other connections retransmit too; only a rise counts)."""
    recent = [s for s in w.retrans if s[0] >= t_recent]
    before = [s for s in w.retrans if s[0] <= t_recent]
    delta = (recent[-1][1] - recent[0][1]) if len(recent) >= 2 else 0.0
    if before and recent:
        delta = recent[-1][1] - before[-1][1]
    base = 0.0
    if len(before) >= 2 and before[-1][0] > before[0][0]:
        base = (before[-1][1] - before[0][1]) / (before[-1][0] - before[0][0])
    return delta, base


def detect_nic_stall(w: Window, cfg: HealthSettings) -> Verdict | None:
    if _in_grace(w, cfg) or _in_pause(w, cfg):
        return None
    t_recent = w.now - cfg.nic_window_s
    last = _last_step_ts(w)
    if not last or any(e >= t_recent for _b, e in w.pauses):
        return None  # no traffic is expected while checkpointing/evaluating, nor just after
    # Steps slow: the current gap, or the recent steps, well beyond the usual step time.
    times = step_times(w)
    typical = median(times) if times else None
    gap = w.now - min(last.values())
    recent_steps = [s for series in w.steps.values() for s in series if s[0] >= t_recent]
    slowed = typical is not None and gap > max(3 * typical, cfg.nic_window_s / 2)
    crawling = False
    if typical and recent_steps:
        recent_times = [s[3] for s in recent_steps if _finite(s[3])]
        crawling = bool(recent_times) and median(recent_times) > 3 * typical
    if not (slowed or crawling):
        return None
    # A stall explained by the ranks themselves is a hang, not the network's fault.
    if _stopped_processes(w):
        return None
    utils = _median_util(w, t_recent)
    if utils and max(utils.values()) >= cfg.gpu_work_util and min(utils.values()) < cfg.gpu_idle_util:
        return None
    retrans_delta, retrans_base = _retrans_rates(w, t_recent)
    retrans_up = retrans_delta >= cfg.nic_min_retrans and retrans_delta > 3 * retrans_base * cfg.nic_window_s
    for name, series in w.nics.items():
        link = w.nic_state.get(name, "unknown")
        # A cut link stalls its peers' NICs too (they wait on the same collective, and retransmit
        # to it): a node whose own link is up holds the stall a little longer, so that the
        # node whose link went down speaks first and the attempt's reason names the cause. A few
        # samples more, not much: a throttled link stays up, and the hang must not come first.
        extra = min(cfg.nic_window_s / 2, 3 * cfg.sample_s)
        hold = cfg.nic_window_s if link not in ("up", "unknown") else cfg.nic_window_s + extra
        t_cur = w.now - hold
        base = [b for t, b in series if w.now - cfg.nic_baseline_s <= t < t_cur]
        cur = _since(series, t_cur)
        if len(base) < 5 or not cur or cur[0][0] > t_cur + cfg.sample_s:
            continue
        base_med = median(base)
        cur_max = max(b for _t, b in cur)
        if base_med < cfg.nic_min_bps or cur_max >= cfg.nic_drop_ratio * base_med:
            continue
        corroborated = []
        if link not in ("up", "unknown"):
            corroborated.append(f"link {link}")
        if retrans_up:
            corroborated.append(f"{retrans_delta:.0f} TCP retransmissions")
        if recent_steps:
            corroborated.append("steps still crawl")
        if not corroborated:
            continue
        return Verdict(
            FailureKind.SILENT_NIC_STALL,
            f"{name} throughput {cur_max:.0f} B/s for {hold:g}s against its median "
            f"{base_med:.0f} B/s while steps slow ({', '.join(corroborated)})",
            {
                "interface": name,
                "current_bps": cur_max,
                "baseline_bps": base_med,
                "link": link,
                "retrans": retrans_delta,
                "step_gap_s": round(gap, 3),
                "typical_step_s": typical,
                "window": _window_evidence(w, cfg.nic_window_s + 40),
            },
        )
    return None


def detect_loss_nan(w: Window, cfg: HealthSettings) -> Verdict | None:
    for rank, series in sorted(w.steps.items()):
        for t, step, loss, _s in series:
            value = _as_loss(loss)
            if value is not None and not math.isfinite(value):
                return Verdict(
                    FailureKind.LOSS_NAN,
                    f"rank {rank} logged a non-finite loss ({loss}) at step {step}",
                    {
                        "rank": rank,
                        "step": step,
                        "loss": str(loss),
                        "t": t,
                        **_nan_origin(w, step),
                        "window": {"steps": {rank: series[-20:]}, "now": w.now},
                    },
                )
    return None


def _nan_origin(w: Window, step: int) -> dict:
    """Which of this node's ranks produced the NaN: those whose own loss (before the ranks'
    losses were combined) was non-finite at that step; and which samples the step read. Chaining
    replays the step to tell the data's NaN from a faulty device's (recovery/nan_replay.py)."""
    first = {r: rec for r, rec in w.nan_records.items() if rec.get("step") == step}
    origin = sorted(
        r for r, rec in first.items() if not _finite(rec.get("local_loss")) and rec.get("local_loss") is not None
    )
    consumed = next(
        (rec.get("consumed_samples") for rec in first.values() if rec.get("consumed_samples") is not None), None
    )
    return {"origin_ranks": origin, "consumed_samples": consumed}


def _robust_z(values: list[float], x: float) -> float:
    med = median(values)
    mad = median([abs(v - med) for v in values])
    scale = 1.4826 * mad or 1e-3 * abs(med) or 1e-12
    return (x - med) / scale


def detect_loss_spike(w: Window, cfg: HealthSettings) -> Verdict | None:
    n = cfg.spike_steps
    for rank, series in sorted(w.steps.items()):
        losses = [(s[1], v) for s in series if (v := _as_loss(s[2])) is not None and math.isfinite(v)]
        if len(losses) < cfg.spike_min_baseline + n:
            continue
        tail = losses[-n:]
        base = [v for _s, v in losses[-(n + cfg.spike_baseline) : -n]]
        zs = [_robust_z(base, v) for _s, v in tail]
        floor = median(base) + cfg.spike_min_rel * abs(median(base))
        if min(zs) > cfg.spike_z and min(v for _s, v in tail) > floor:
            return Verdict(
                FailureKind.LOSS_SPIKE,
                f"rank {rank} loss spiked for {n} steps (z {min(zs):.1f}..{max(zs):.1f} > {cfg.spike_z:g}) "
                f"at step {tail[-1][0]}, baseline median {median(base):.4g}",
                {
                    "rank": rank,
                    "steps": [s for s, _v in tail],
                    "losses": [v for _s, v in tail],
                    "z": [round(z, 2) for z in zs],
                    "baseline_median": median(base),
                    "window": {"steps": {rank: series[-(n + cfg.spike_baseline) :]}, "now": w.now},
                },
            )
    return None


DETECTORS = (
    detect_loss_nan,
    detect_loss_spike,
    detect_nic_stall,
    detect_gpu_idle,
    detect_checkpoint_stalled,
    detect_hang,
)


def detect_all(window: Window | dict, cfg: HealthSettings) -> list[Verdict]:
    """Every verdict the window supports, most specific cause first."""
    w = window if isinstance(window, Window) else Window.from_dict(window)
    return [v for d in DETECTORS if (v := d(w, cfg)) is not None]
