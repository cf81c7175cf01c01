"""Section timeouts learned from the run, and the `checkpoint.stalled` verdict.

A run is made of sections (`aerie_contracts.health.Section`): setup, steps, checkpoint stalls
(the synchronous part of a save), checkpoint uploads (the asynchronous part, beside the steps)
and evals. Each gets its own limit, `max(floor, factor x p95)` of its durations in this job's
history: this attempt's (the window) and the previous attempts' (`Window.learned`, handed over by
the control plane in `AERIE_SECTIONS`), so a restarted attempt starts with what was learned.

Without any history a stall, upload or eval may last `pause_max_s` (the cold limit), the
wind-down after the last step `wind_down_floor_s`, setup `first_step_timeout_s`; setup's learned
limit never goes below that (a restarted attempt also restores a checkpoint, so a fresh attempt's
setup is no guide to its lower bound).
"""

from __future__ import annotations

from aerie_contracts.failures import FailureKind
from aerie_contracts.health import LEARNED_SAMPLES, HealthSettings, Section
from agent.probes.progress import CHECKPOINT
from agent.window import Verdict, Window, percentile, step_times, window_evidence


def samples(w: Window, section: Section) -> list[float]:
    """Every duration of `section` known to this window: learned ones first, then this attempt's."""
    own = list(w.sections.get(section.value, []))
    if section is Section.STEP:
        own = step_times(w)
    elif section is Section.SETUP and w.first_step_t is not None:
        own = [max(0.0, w.first_step_t - w.started_at)]
    return list(w.learned.get(section.value, [])) + own


def section_limit(w: Window, cfg: HealthSettings, section: Section) -> tuple[float, float | None]:
    """(limit in seconds, the p95 it was learned from or None when nothing was observed yet)."""
    p95 = percentile(samples(w, section), 95)
    if section is Section.STEP:
        return max(cfg.hang_floor_s, cfg.hang_factor * p95 if p95 is not None else 0.0), p95
    if section is Section.SETUP:
        return max(cfg.first_step_timeout_s, cfg.section_factor * p95 if p95 is not None else 0.0), p95
    if section is Section.WIND_DOWN:
        # Once per attempt, so rarely learned: its floor, not the cold pause_max_s (a rank hung at
        # exit would go unnamed for half an hour), or longer if this job's saves take longer (a
        # final save is a save; a third-party trainer's is invisible to the agent).
        stall = percentile(samples(w, Section.CHECKPOINT_STALL), 95)
        learned = [cfg.section_factor * x for x in (p95, stall) if x is not None]
        return max([cfg.wind_down_floor_s, *learned]), p95
    if p95 is None:
        return cfg.pause_max_s, None
    floor = {
        Section.CHECKPOINT_STALL: cfg.stall_floor_s,
        Section.CHECKPOINT_UPLOAD: cfg.upload_floor_s,
        Section.EVAL: cfg.eval_floor_s,
        Section.WIND_DOWN: cfg.wind_down_floor_s,
    }[section]
    return max(floor, cfg.section_factor * p95), p95


def learned_summary(w: Window) -> dict[str, list[float]]:
    """What a heartbeat reports and the next attempt starts with: per section, the durations of
    the job's history as this node knows it (learned + own, newest last)."""
    out = {}
    for section in Section:
        values = samples(w, section)[-LEARNED_SAMPLES:]
        if values:
            out[section.value] = [round(v, 4) for v in values]
    return out


def detect_checkpoint_stalled(w: Window, cfg: HealthSettings) -> Verdict | None:
    """A save open past its section's learned limit: its synchronous part (the loop is stuck in
    the save) or its upload (steps may go on; the upload never finishes). The save is abandoned:
    the agent stops the ranks on the verdict, so it is never committed."""
    checks = [(Section.CHECKPOINT_UPLOAD, rank, t0) for rank, t0 in w.uploads.items()]
    checks += [(Section.CHECKPOINT_STALL, rank, o[CHECKPOINT]) for rank, o in w.open.items() if CHECKPOINT in o]
    worst: tuple[float, Section, str, float, float | None] | None = None
    for section, rank, t0 in checks:
        limit, p95 = section_limit(w, cfg, section)
        over = (w.now - t0) - limit
        if over > 0 and (worst is None or over > worst[0]):
            worst = (over, section, rank, limit, p95)
    if worst is None:
        return None
    _over, section, rank, limit, p95 = worst
    t0 = w.uploads[rank] if section is Section.CHECKPOINT_UPLOAD else w.open[rank][CHECKPOINT]
    part = "upload" if section is Section.CHECKPOINT_UPLOAD else "synchronous part"
    learned = f"{cfg.section_factor:g} x p95 {p95:.1f}s" if p95 is not None else "no history: pause_max_s"
    return Verdict(
        FailureKind.CHECKPOINT_STALLED.value,
        f"rank {rank}'s checkpoint {part} open for {w.now - t0:.0f}s (limit {limit:.0f}s, {learned}); "
        "the save is abandoned",
        {
            "section": section.value,
            "rank": rank,
            "open_s": round(w.now - t0, 3),
            "limit_s": round(limit, 3),
            "p95_s": p95,
            "samples": len(samples(w, section)),
            "window": window_evidence(w, 60.0),
        },
    )
