"""On "checkpoint committed": keep `keep_last` (and every `keep_every`-th step), delete the rest.

Never deletes the newest good checkpoint nor one any attempt of the job resumed from (the
manifest module enforces the first; the protect list the second), so a GC racing a restart can't
pull the floor from under it.
"""

from __future__ import annotations

from typing import Any

from lambdas.api import Api


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    if event.get("detail-type") != "Aerie Checkpoint Committed":
        return {"deleted": []}
    api = Api.from_context(context)
    job = api.job(event["detail"]["job_id"])
    ckpt = job["spec"].get("checkpoint") or {}
    if not ckpt.get("s3_uri"):
        return {"deleted": []}
    from trainer.checkpoint.manifest import gc

    prefix = ckpt["s3_uri"].rstrip("/") + "/" + job["id"]
    protect = [a["resume_from"] for a in job["attempt_list"] if a.get("resume_from")]
    deleted = gc(prefix, keep_last=int(ckpt.get("keep_last", 3)), keep_every=int(ckpt.get("keep_every") or 0), protect=protect)
    return {"deleted": list(deleted)}
