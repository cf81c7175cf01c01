"""On a failed attempt: restart the job from its last good checkpoint, or end it.

Triggered by "Aerie Attempt State Change" events with state Failed (and by SageMaker's own
"SageMaker Training Job State Change" events, mapped onto the same shape). Decides, in order:
  1. stale or irrelevant event (not the latest attempt, job already over) -> nothing;
  2. the user's fault (`user.error`, an exit code the spec marks non-retryable) -> job Failed;
  3. retry budget (`retry.max_restarts`) spent -> job Failed with the last failure's reason;
  4. otherwise -> attempt N+1, resuming from `last_good` of the job's checkpoint prefix and
     excluding nodes that verdicts blamed.
Idempotent: attempt N+1 is created by the store under a (job, number) unique constraint, so a
redelivered or duplicated event gets 409 and changes nothing.
"""

from __future__ import annotations

import logging
from typing import Any

from lambdas.api import Api, ApiError

log = logging.getLogger("aerie.lambdas.chain_restart")

SAGEMAKER_STATE_CHANGE = "SageMaker Training Job State Change"
# Failures that are not the user's code: restart them.
RETRYABLE = {"silent.hang", "silent.gpu_idle", "silent.nic_stall", "loss.nan", "loss.spike", "node.lost",
             "node.straggler", "exit.nonzero", "launch.failed", "checkpoint.failed", "sagemaker.failed"}


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    detail = _attempt_detail(event)
    if detail is None or detail.get("state") != "Failed":
        return {"action": "none", "why": "not an attempt failure"}
    api = Api.from_context(context)
    job = api.job(detail["job_id"])
    if job["state"] in ("Completed", "Failed", "Stopped"):
        return {"action": "none", "why": f"job already {job['state']}"}
    attempts = job["attempt_list"]
    latest = max(a["number"] for a in attempts)
    number = int(detail["attempt"])
    if number != latest:
        return {"action": "none", "why": f"attempt {number} is not the latest ({latest})"}
    failed = next(a for a in attempts if a["number"] == number)
    spec = job["spec"]
    reason = failed.get("reason") or detail.get("reason") or {}

    verdict = classify(reason, spec)
    if verdict != "retry":
        return _fail(api, job, {**reason, "kind": reason.get("kind", "exit.nonzero"),
                                "message": f"not retried: {verdict}. {reason.get('message', '')}".strip()})
    max_restarts = int(spec.get("retry", {}).get("max_restarts", 0))
    if number - 1 >= max_restarts:
        # The job fails with its last failure's own kind: that is the cause a person needs.
        return _fail(api, job, {**reason, "retry_exhausted": True, "attempts": number,
                                "message": f"{reason.get('message', '')} — {number} attempt(s) failed, "
                                           f"retry.max_restarts={max_restarts}".strip(" —")})

    resume_from = last_good_checkpoint(spec, job["id"])
    exclude = sorted(set(failed.get("exclude_nodes") or []) | blamed_hosts(job, failed, spec))
    body = {"number": number + 1, "resume_from": resume_from, "exclude_nodes": exclude,
            "cause": {"event_id": event.get("id"), "failed_attempt": number, "reason": reason}}
    try:
        api.call("POST", f"/v1/jobs/{job['id']}/attempts", body)
    except ApiError as exc:
        if exc.status == 409:  # someone (a redelivery) already created it
            return {"action": "none", "why": "attempt already created"}
        raise
    log.info("job %s: attempt %d failed (%s); attempt %d resumes from %s", job["id"], number,
             reason.get("kind"), number + 1, resume_from or "scratch")
    return {"action": "restart", "attempt": number + 1, "resume_from": resume_from, "exclude_nodes": exclude}


def classify(reason: dict[str, Any], spec: dict[str, Any]) -> str:
    """'retry', or why not."""
    kind = reason.get("kind", "exit.nonzero")
    if kind == "user.error":
        return "the job's input or code is wrong (user.error)"
    if kind == "exit.nonzero" and not reason.get("signal"):
        code = reason.get("exit_code")
        if code in set(spec.get("retry", {}).get("non_retryable_exit_codes", [])):
            return f"exit code {code} is marked non-retryable in retry.non_retryable_exit_codes"
    if kind not in RETRYABLE and not kind.startswith(("silent.", "loss.", "node.")):
        return f"failure kind {kind!r} is not retryable"
    return "retry"


def last_good_checkpoint(spec: dict[str, Any], job_id: str) -> str | None:
    """The newest verified checkpoint of the job, or None (start from scratch)."""
    ckpt = spec.get("checkpoint") or {}
    if not ckpt.get("s3_uri"):
        return None
    from trainer.checkpoint.manifest import last_good

    return last_good(ckpt["s3_uri"].rstrip("/") + "/" + job_id)


def blamed_hosts(job: dict[str, Any], failed: dict[str, Any], spec: dict[str, Any]) -> set[str]:
    if not spec.get("retry", {}).get("exclude_bad_nodes", True):
        return set()
    hosts = {v["host"] for v in job.get("verdicts", []) if v["attempt_id"] == failed["id"]}
    reason = failed.get("reason") or {}
    if reason.get("kind") == "node.lost" and reason.get("host"):
        hosts.add(reason["host"])
    return hosts


def _fail(api: Api, job: dict[str, Any], reason: dict[str, Any]) -> dict[str, Any]:
    api.call("POST", f"/v1/jobs/{job['id']}/fail", {"reason": reason})
    return {"action": "fail", "reason": reason}


def _attempt_detail(event: dict[str, Any]) -> dict[str, Any] | None:
    if event.get("detail-type") == "Aerie Attempt State Change":
        return event.get("detail") or {}
    if event.get("detail-type") == SAGEMAKER_STATE_CHANGE:
        from lambdas.sagemaker_events import event_from_sagemaker

        mapped = event_from_sagemaker(event)
        return (mapped or {}).get("detail")
    return None
