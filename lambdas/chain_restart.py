"""On a failed attempt: restart the job from its last good checkpoint, or end it.

Triggered by "Aerie Attempt State Change" events with state Failed (and by SageMaker's own
"SageMaker Training Job State Change" events, mapped onto the same shape). The decision is the
recovery package's (`recovery.policy.next_step`: classify, blame, budget, strategy, resume
point); this handler reads the job, asks it, and carries the answer out with one call: the next
attempt (`POST .../attempts`) or the job's end (`POST .../fail`). Idempotent: a blame is recorded
once per (attempt, host), and attempt N+1 is created by the store under a (job, number) unique
constraint, so a redelivered or duplicated event gets 409 and changes nothing.
"""

from __future__ import annotations

import logging
from typing import Any

from aerie_contracts import routes
from aerie_contracts.events import DetailType
from aerie_contracts.states import AttemptState
from lambdas.api import Api, ApiError
from recovery import policy

log = logging.getLogger("aerie.lambdas.chain_restart")

SAGEMAKER_STATE_CHANGE = DetailType.SAGEMAKER_TRAINING_JOB_STATE_CHANGE.value


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    detail = _attempt_detail(event)
    if detail is None or detail.get("state") != AttemptState.FAILED:
        return {"action": "none", "why": "not an attempt failure"}
    api = Api.from_context(context)
    job = api.job(detail["job_id"])
    number = int(detail["attempt"])
    stale = policy.stale(job, number)
    if stale is not None:
        return {"action": stale.action, "why": stale.why}
    failed = next(a for a in job["attempt_list"] if a["number"] == number)
    reason = failed.get("reason") or detail.get("reason") or {}
    decision = policy.next_step(api, job, number, reason, event_id=event.get("id"))

    if decision.action == policy.FAIL:
        api.call("POST", routes.job_fail(job["id"]), {"reason": decision.reason})
        return {"action": "fail", "reason": decision.reason}
    try:
        api.call("POST", routes.job_attempts(job["id"]), decision.attempt)
    except ApiError as exc:
        if exc.status == 409:  # someone (a redelivery) already created it
            return {"action": "none", "why": "attempt already created"}
        raise
    s = decision.summary
    log.info(
        "job %s: attempt %d failed (%s); attempt %d resumes from %s, %s: %s",
        job["id"],
        number,
        reason.get("kind"),
        s["attempt"],
        s["resume_from"] or "scratch",
        s["mode"],
        s["mode_reason"],
    )
    return {"action": "restart", **s}


def _attempt_detail(event: dict[str, Any]) -> dict[str, Any] | None:
    if event.get("detail-type") == DetailType.ATTEMPT_STATE_CHANGE:
        return event.get("detail") or {}
    if event.get("detail-type") == SAGEMAKER_STATE_CHANGE:
        from lambdas.sagemaker_events import event_from_sagemaker

        mapped = event_from_sagemaker(event)
        return (mapped or {}).get("detail")
    return None
