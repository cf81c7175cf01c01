"""What the dashboard's pages show, assembled from the store (no HTTP here, so tests can call it).

Everything is read through `store/repo/` and scoped by the viewer's tenant by the caller.
"""

from __future__ import annotations

import math
import time
from typing import Any

from sqlalchemy.orm import Session

from aerie_contracts import DetailType, preflight
from aerie_contracts.checkpoints import step_of_uri
from aerie_contracts.states import JOB_TERMINAL
from orchestrator.api.read_model import attempts_out
from orchestrator.stacks_view import stop_time_lines
from orchestrator.store import repo
from orchestrator.store.models import Attempt, Event, Job
from orchestrator.web.downsample import minmax
from orchestrator.web.health import FIELDS, NodeHistory

MAX_POINTS = 2000  # per series: a chart is ~1,000 px wide; min/max buckets keep the spikes
HEALTH_POINTS = 2000  # per health chart, shared by its nodes
LOG_TAIL_BYTES = 4096


def job_rows(
    s: Session, tenant: str, state: str | None, name: str | None, backend: str | None, limit: int = 200
) -> list[dict[str, Any]]:
    """The jobs list: one row per job with its latest step, loss, throughput and checkpoint."""
    jobs = repo.list_jobs(
        s, tenant, state or None, limit, 0, name=name or None, backend=backend or None, with_attempts=True
    )
    ids = [j.id for j in jobs]
    points = repo.latest_metrics(s, ids)
    ckpts = repo.latest_checkpoints(s, ids)
    rows = []
    for job in jobs:
        latest = job.attempts[-1] if job.attempts else None
        summaries = [n.summary or {} for n in (latest.nodes if latest else [])]
        point = points.get(job.id)
        node_step = max((x["last_step"] for x in summaries if isinstance(x.get("last_step"), int)), default=None)
        node_loss = next((x["last_loss"] for x in summaries if isinstance(x.get("last_loss"), (int, float))), None)
        rows.append(
            dict(
                id=job.id,
                name=job.name,
                state=job.state,
                backend=job.backend,
                attempts=len(job.attempts),
                step=max([x for x in (node_step, point.step if point else None) if x is not None], default=None),
                loss=point.loss if point and point.loss is not None else node_loss,
                tokens_per_s=point.tokens_per_s if point else None,
                checkpoint=ckpts.get(job.id),
                created_at=job.created_at,
                reason=job.reason,
            )
        )
    return rows


def job_panels(s: Session, job: Job, backend: Any, goodput_cache: dict | None = None) -> dict[str, Any]:
    """Everything on the job page except the curves: attempts, verdicts, nodes, events, logs."""
    attempts = attempts_out(job)
    numbers = {a.id: a.number for a in job.attempts}
    rows = repo.verdicts_of(s, list(numbers))
    verdicts = [
        dict(t=v.t, attempt=numbers.get(v.attempt_id), host=v.host, kind=v.kind, message=v.message) for v in rows
    ]
    # What each rank was doing when a hang was called, the rank the others waited for first.
    stacks = stop_time_lines(
        [dict(attempt_id=v.attempt_id, host=v.host, kind=v.kind, t=v.t, evidence=v.evidence or {}) for v in rows]
    )
    events = [
        dict(seq=e.seq, t=e.time, kind=e.detail_type.replace("Aerie ", ""), text=_event_text(e))
        for e in repo.list_events(s, job)
    ][-200:]
    latest = job.attempts[-1] if job.attempts else None
    checkpoints = repo.list_checkpoints(s, job)
    return dict(
        preflights=preflight_rows(job),
        job=job,
        attempts=attempts,
        verdicts=verdicts,
        stacks=stacks,
        events=list(reversed(events)),
        nodes=list(attempts[-1].nodes) if attempts else [],
        latest=latest,
        checkpoints=len(checkpoints),
        last_checkpoint=checkpoints[-1] if checkpoints else None,
        logs=_log_tail(latest, backend),
        running=job.state not in JOB_TERMINAL,
        goodput=goodput_panel(s, job, goodput_cache),
    )


def preflight_rows(job: Job) -> list[dict[str, Any]]:
    """Every node's pre-flight result, attempt by attempt: each check's value against its threshold
    and, for a node that failed, why."""
    rows = []
    for a in job.attempts:
        for n in a.nodes:
            res = n.preflight
            if not res:
                continue
            checks = [
                dict(
                    name=c.get("check"),
                    passed=bool(c.get("passed")),
                    skipped=bool(c.get("skipped")),
                    value=c.get("value"),
                    threshold=c.get("threshold"),
                    unit=c.get("unit") or "",
                    reason=c.get("reason") or "",
                )
                for c in res.get("checks") or []
                if isinstance(c, dict)
            ]
            rows.append(
                dict(
                    attempt=a.number,
                    host=n.host,
                    passed=bool(res.get("passed")) and not preflight.failed_checks(res),
                    elapsed_s=res.get("elapsed_s"),
                    checks=checks,
                    summary=preflight.summary_line(res),
                )
            )
    return rows


def goodput_panel(s: Session, job: Job, cache: dict | None = None) -> dict[str, Any]:
    """The ledger as the page draws it: a stacked bar over the job's timeline (each segment's
    offset and width in % of wall time; slivers under MIN_PCT are left out of the bar, never of
    the totals) and a legend of every category with its share.

    A ledger reads every step point of the job (~0.5 s for 100,000 steps here), and the page polls
    every 2 s while the job runs: the same state (job state, attempts, points) is served from
    `cache` for GOODPUT_TTL_S, so a viewer's bar lags by at most that."""
    from aerie_contracts.goodput import LABELS, Category
    from orchestrator.goodput import ledger_for

    key = (job.state, len(job.attempts), job.attempts[-1].state if job.attempts else None, repo.metrics_version(s, job))
    hit = cache.get(job.id) if cache is not None else None
    if hit is not None and hit[0] == key and time.monotonic() - hit[1] < GOODPUT_TTL_S:
        return hit[2]
    led = ledger_for(s, job)
    wall = led["end"] - led["start"]
    bar = []
    if wall > 0:
        for seg in led["segments"]:
            width = 100.0 * (seg["end"] - seg["start"]) / wall
            if width >= MIN_PCT:
                left = 100.0 * (seg["start"] - led["start"]) / wall
                bar.append(dict(seg, left=left, width=width, label=LABELS.get(seg["category"], seg["category"])))
    total = led["node_seconds"] or 1.0
    legend = [
        dict(
            category=c.value,
            label=LABELS[c],
            node_s=led["categories"][c.value],
            pct=100 * led["categories"][c.value] / total,
        )
        for c in Category
    ]
    panel = dict(ledger=led, bar=bar, legend=legend)
    if cache is not None:
        if len(cache) > 256:
            cache.clear()
        cache[job.id] = (key, time.monotonic(), panel)
    return panel


MIN_PCT = 0.05
GOODPUT_TTL_S = 10.0


def checkpoint_rows(s: Session, job: Job) -> list[dict[str, Any]]:
    """Checkpoints with their human-eval ratings and whether a restart resumed from them."""
    raters = int(((job.spec or {}).get("eval") or {}).get("raters_needed") or 1)
    ratings = {r["uri"]: r for r in repo.ratings_by_checkpoint(s, job, raters)}
    resumed_by = {a.resume_from: a.number for a in job.attempts if a.resume_from}
    numbers = {a.id: a.number for a in job.attempts}
    return [
        dict(
            step=c.step,
            uri=c.uri,
            state=c.state,
            attempt=numbers.get(c.attempt_id or ""),
            size=c.size_bytes or (c.meta or {}).get("size_bytes"),
            reason=c.reason,
            created_at=c.created_at,
            resumed_by=resumed_by.get(c.uri),
            rating=ratings.get(c.uri),
        )
        for c in reversed(repo.list_checkpoints(s, job))
    ]


def series(s: Session, job: Job, history: NodeHistory, cache: dict, max_points: int = MAX_POINTS) -> dict[str, Any]:
    """The curves of the whole chain of attempts, downsampled, plus node health and markers."""
    count, newest = repo.metrics_version(s, job)
    key = (count, newest, tuple((a.number, a.resume_from) for a in job.attempts))
    hit = cache.get((job.id, max_points))
    # Reuse the last answer while nothing changed, and also while it is younger than 5x what it
    # took to compute: a huge running job then costs polling viewers at most ~20 % of a core.
    if hit is None or (hit[0] != key and time.monotonic() - hit[1] > 5 * hit[2]):
        started = time.monotonic()
        metrics = _chain_metrics(repo.metric_rows(s, job), job.attempts, max_points)
        if len(cache) > 64:
            cache.clear()
        hit = cache[(job.id, max_points)] = (key, time.monotonic(), time.monotonic() - started, metrics)
    metrics = hit[3]
    numbers = {a.id: a.number for a in job.attempts}
    verdicts = [
        dict(
            t=round(v.t, 1),
            attempt=numbers.get(v.attempt_id),
            host=v.host,
            kind=v.kind,
            step=_step_at(metrics["_steps_at"], numbers.get(v.attempt_id), v.t),
        )
        for v in repo.verdicts_of(s, list(numbers))
    ]
    return {
        "points": metrics["points"],
        "series": metrics["series"],
        "resumes": metrics["resumes"],
        "verdicts": verdicts,
        "health": _health(history, [a.id for a in job.attempts]),
        "running": job.state not in JOB_TERMINAL,
    }


def _chain_metrics(rows: list[tuple], attempts: list[Attempt], max_points: int) -> dict[str, Any]:
    """Stitch attempts into one curve: attempt N's steps after the step attempt N+k resumed from
    were redone, so they are dropped (the chain is what the final model went through)."""
    resumes = {a.number: (step_of_uri(a.resume_from) or 0) for a in attempts if a.number > 1}
    cut: dict[int, float] = {}
    for a in attempts:
        later = [r for n, r in resumes.items() if n > a.number]
        cut[a.number] = min(later) if later else math.inf
    kept: list[tuple] = []
    steps_at: dict[int, list[tuple[float, int]]] = {}
    for r in rows:
        steps_at.setdefault(r[0], []).append((r[2], r[1]))
        if r[1] > cut.get(r[0], math.inf):
            continue
        if kept and kept[-1][1] == r[1]:
            kept[-1] = r  # the same step again, by a later attempt: the later one counts
        else:
            kept.append(r)
    xs = [r[1] for r in kept]
    out = {}
    for i, name in enumerate(repo.METRIC_SERIES):
        x, y = minmax(xs, [r[3 + i] for r in kept], max_points)
        if y:
            out[name] = {"x": x, "y": y}
    # Per attempt, a few (t, step) pairs are enough to place a verdict on the step axis.
    sparse = {n: pts[:: max(1, len(pts) // 500)] + pts[-1:] for n, pts in steps_at.items()}
    return {
        "points": len(kept),
        "series": out,
        "_steps_at": sparse,
        "resumes": [{"attempt": n, "step": r} for n, r in sorted(resumes.items())],
    }


def _step_at(steps_at: dict[int, list[tuple[float, int]]], attempt: int | None, t: float) -> int | None:
    before = [step for ts, step in steps_at.get(attempt or 0, []) if ts <= t]
    return max(before) if before else None


def _health(history: NodeHistory, attempt_ids: list[str]) -> dict[str, Any]:
    hosts = history.series(attempt_ids)
    budget = max(20, HEALTH_POINTS // max(1, len(hosts)))
    out: dict[str, Any] = {}
    for host, points in sorted(hosts.items()):
        ts = [p[0] for p in points]
        out[host] = {}
        for i, name in enumerate(FIELDS[1:], start=1):
            x, y = minmax(ts, [p[i] for p in points], budget)
            out[host][name] = {"x": x, "y": y}
    return out


def _event_text(e: Event) -> str:
    d = e.detail or {}
    reason = d.get("reason") or {}
    why = f" ({reason.get('kind')})" if isinstance(reason, dict) and reason.get("kind") else ""
    if e.detail_type == DetailType.JOB_STATE_CHANGE:
        return f"job {d.get('state')}{why}"
    if e.detail_type == DetailType.ATTEMPT_STATE_CHANGE:
        return f"attempt {d.get('attempt')} {d.get('state')}{why}"
    if e.detail_type == DetailType.CHECKPOINT_COMMITTED:
        return f"checkpoint step {d.get('step')} committed"
    if e.detail_type == DetailType.VERDICT_RAISED:
        return f"verdict {d.get('kind')} on {d.get('host')}: {d.get('message', '')}"
    if e.detail_type == DetailType.SPARE_REPLACED:
        return str(d.get("why") or f"hot spare {d.get('host')} replaced")
    if e.detail_type == DetailType.PREFLIGHT_CHECKED:
        spare = " (hot spare)" if d.get("spare") else ""
        return f"pre-flight on {d.get('host')}{spare} (attempt {d.get('attempt')}): {d.get('summary', '')}"
    return e.detail_type


def _log_tail(attempt: Attempt | None, backend: Any) -> dict[str, str]:
    """The last few KB of each node's log (the same backend call as `aerie logs`)."""
    if attempt is None or not attempt.handle or backend is None:
        return {}
    try:
        hosts = attempt.handle.get("hosts", [])
        return {
            h: c.get("text", "")
            for h, c in backend.logs(
                attempt.handle, {h: -LOG_TAIL_BYTES for h in hosts}, max_bytes=LOG_TAIL_BYTES
            ).items()
        }
    except Exception as exc:  # a backend that can't read logs must not break the page
        return {"(logs)": f"unavailable: {exc}"}


def now() -> float:
    return time.time()
