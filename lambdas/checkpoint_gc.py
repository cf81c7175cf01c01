"""On "checkpoint committed": keep `keep_last` (and every `keep_every`-th step), delete the rest.

Never deletes the newest good checkpoint nor one any attempt of the job resumed from or falls
back to (an attempt resuming from a memory checkpoint names its S3 fallback in its cause) (the
manifest module enforces the first; the protect list the second), so a GC racing a restart can't
pull the floor from under it. "Good" is as the control plane recorded it (a superseded attempt's
commit is not, and goes once older than the newest good one); the checkpoints it deleted are
reported back, so their records say `deleted`.

The memory tier has no objects to delete: its records that no restart can use any more
(`aerie_contracts.checkpoints.expired_memory`: older than the newest good S3 checkpoint, replaced
by a newer memory one, incomplete of an ended attempt) are marked `deleted` too. The store does
so itself as they expire; this is the safety net, and never counts a memory checkpoint as a
good one for S3's policy.
"""

from __future__ import annotations

from typing import Any

from aerie_contracts import DetailType, routes
from aerie_contracts.checkpoints import expired_memory
from aerie_contracts.restarts import CAUSE_RESUME_FALLBACK
from aerie_contracts.states import ATTEMPT_TERMINAL, JOB_TERMINAL, CheckpointState
from lambdas.api import Api


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    if event.get("detail-type") != DetailType.CHECKPOINT_COMMITTED:
        return {"deleted": []}
    api = Api.from_context(context)
    job = api.job(event["detail"]["job_id"])
    ckpt = job["spec"].get("checkpoint") or {}
    expired = expire_memory(api, job)
    if not ckpt.get("s3_uri"):
        return {"deleted": [], "expired_memory": expired}
    from aerie_checkpoint.gc import prune
    from recovery.resume import recorded_checkpoints

    prefix = ckpt["s3_uri"].rstrip("/") + "/" + job["id"]
    protect = [a["resume_from"] for a in job["attempt_list"] if a.get("resume_from")]
    protect += [
        (a.get("cause") or {})[CAUSE_RESUME_FALLBACK]
        for a in job["attempt_list"]
        if (a.get("cause") or {}).get(CAUSE_RESUME_FALLBACK)
    ]
    deleted = prune(
        prefix,
        keep_last=int(ckpt.get("keep_last", 3)),
        keep_every=int(ckpt.get("keep_every") or 0),
        protect=protect,
        recorded=recorded_checkpoints(api, job["id"]),
    )
    if deleted:
        body = {"uris": list(deleted), "state": "deleted", "reason": "deleted by checkpoint GC"}
        for i in range(0, len(deleted), 1000):
            api.call("POST", routes.job_checkpoint_states(job["id"]), {**body, "uris": body["uris"][i : i + 1000]})
    return {"deleted": list(deleted), "expired_memory": expired}


def expire_memory(api: Api, job: dict[str, Any]) -> list[str]:
    """Mark the job's memory checkpoints that no restart can use any more `deleted`, each with its
    reason; returns their URIs."""
    rows = api.call("GET", routes.job_checkpoints(job["id"]) + "?limit=10000") or []
    ended = {a["id"] for a in job["attempt_list"] if a.get("state") in ATTEMPT_TERMINAL}
    gone = expired_memory(rows, job_over=job.get("state") in JOB_TERMINAL, ended_attempts=ended)
    by_reason: dict[str, list[str]] = {}
    for uri, why in gone.items():
        by_reason.setdefault(why, []).append(uri)
    for why, uris in by_reason.items():
        for i in range(0, len(uris), 1000):
            body = {"uris": uris[i : i + 1000], "state": CheckpointState.DELETED.value, "reason": why}
            api.call("POST", routes.job_checkpoint_states(job["id"]), body)
    return sorted(gone)
