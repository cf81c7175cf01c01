"""Which committed checkpoints a job's eval samples: every N-th good one, or the first after each
firing of a cron `schedule` (`orchestrator.spec.EvalConfig`), decided from the store's records
only (good checkpoints, their commit times, which were sampled), so redeliveries agree."""

from __future__ import annotations

from typing import Any

from aerie_contracts import routes
from aerie_contracts.checkpoints import CheckpointTier
from lambdas.api import Api
from lambdas.cron import parse_cron


def not_selected(ev: dict[str, Any], job: dict[str, Any], api: Api, uri: str) -> str | None:
    """None when this checkpoint is to be sampled, else why not. Decided from the store's records
    only (good checkpoints, their commit times, which were sampled), so redeliveries agree."""
    every, schedule = ev.get("every_n_checkpoints"), str(ev.get("schedule") or "")
    if not every and not schedule:
        return None
    # Durable (S3) checkpoints only: a memory checkpoint is never sampled nor counted.
    rows = api.call("GET", routes.job_checkpoints(job["id"]))
    checkpoints = sorted(
        (c for c in rows if c["state"] == "good" and c.get("tier", CheckpointTier.S3) == CheckpointTier.S3),
        key=lambda c: c["step"],
    )
    mine = next((c for c in checkpoints if c["uri"] == uri), None)
    if mine is None:
        return "the checkpoint is not (or no longer) good"
    earlier = [c for c in checkpoints if c["step"] < mine["step"]]
    if every:
        n = len(earlier) + 1
        return None if n % int(every) == 0 else f"good checkpoint #{n}, sampling every {every}"
    sampled = {s["checkpoint_uri"] for s in api.call("GET", routes.job_eval_samples(job["id"]))}
    previous = [c for c in earlier if c["uri"] in sampled]
    start = previous[-1]["created_at"] if previous else job["created_at"]
    if parse_cron(schedule).fired_between(start, mine["created_at"]):
        return None
    return f"schedule {schedule!r} has not fired since the last sampled checkpoint"
