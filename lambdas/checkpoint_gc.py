"""On "checkpoint committed": keep `keep_last` (and every `keep_every`-th step), delete the rest.

Never deletes the newest good checkpoint nor one any attempt of the job resumed from (the
manifest module enforces the first; the protect list the second), so a GC racing a restart can't
pull the floor from under it. "Good" is as the control plane recorded it (a superseded attempt's
commit is not, and goes once older than the newest good one); the checkpoints it deleted are
reported back, so their records say `deleted`.
"""

from __future__ import annotations

from typing import Any

from aerie_contracts import DetailType
from lambdas.api import Api


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    if event.get("detail-type") != DetailType.CHECKPOINT_COMMITTED:
        return {"deleted": []}
    api = Api.from_context(context)
    job = api.job(event["detail"]["job_id"])
    ckpt = job["spec"].get("checkpoint") or {}
    if not ckpt.get("s3_uri"):
        return {"deleted": []}
    from lambdas.chain_restart import recorded_checkpoints
    from trainer.checkpoint.gc import prune

    prefix = ckpt["s3_uri"].rstrip("/") + "/" + job["id"]
    protect = [a["resume_from"] for a in job["attempt_list"] if a.get("resume_from")]
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
            api.call("POST", f"/v1/jobs/{job['id']}/checkpoints/state", {**body, "uris": body["uris"][i : i + 1000]})
    return {"deleted": list(deleted)}
