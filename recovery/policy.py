"""The next step after a failed attempt, decided once: restart (how, from where, without which
nodes) or give up. `next_step` asks the package's questions in order (see `recovery/__init__.py`)
and returns a `Decision` the handler carries out with one call; the blames it records and the
checkpoint states it corrects on the way are facts, recorded whatever the decision."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from aerie_contracts import routes
from aerie_contracts.failures import FailureKind
from aerie_contracts.restarts import CAUSE_MODE, CAUSE_MODE_REASON, CAUSE_REPLACED_NODES
from aerie_contracts.states import JOB_TERMINAL, AttemptState
from recovery import budget, nan_replay, resume, strategies
from recovery.blame import blame_attempt
from recovery.classify import RETRY, classify
from recovery.resume import Transport

RESTART, FAIL, NONE = "restart", "fail", "none"


@dataclass(frozen=True)
class Decision:
    action: str  # RESTART | FAIL | NONE
    why: str = ""
    reason: dict[str, Any] | None = None  # FAIL: the job's reason
    attempt: dict[str, Any] | None = None  # RESTART: the next attempt (POST .../attempts)
    summary: dict[str, Any] = field(default_factory=dict)


def stale(job: dict[str, Any], number: int) -> Decision | None:
    """Nothing to do for an event about attempt `number`: the job is over, a later attempt exists,
    or the store does not have it failed yet (SageMaker's own event may beat the control plane's
    poll; the control plane's event for the same failure follows once it records it)."""
    if job["state"] in JOB_TERMINAL:
        return Decision(NONE, f"job already {job['state']}")
    latest = max(a["number"] for a in job["attempt_list"])
    if number != latest:
        return Decision(NONE, f"attempt {number} is not the latest ({latest})")
    failed = next(a for a in job["attempt_list"] if a["number"] == number)
    if failed["state"] != AttemptState.FAILED:
        return Decision(NONE, f"attempt {number} is {failed['state']} in the store, not Failed yet")
    return None


def will_retry(spec: dict[str, Any], number: int, reason: dict[str, Any]) -> bool:
    """Whether failed attempt `number` will be followed by another, as far as its reason and the
    budget tell before blame (what SageMaker's read model shows as `Restarting`)."""
    return not budget.restarts_spent(spec, number) and classify(reason, spec) == RETRY


def next_step(
    api: Transport, job: dict[str, Any], number: int, reason: dict[str, Any], event_id: str | None = None
) -> Decision:
    """What follows failed attempt `number` of `job` (as `GET /v1/jobs/{id}` returns it)."""
    spec = job["spec"]
    failed = next(a for a in job["attempt_list"] if a["number"] == number)

    # Attribute first, whatever follows: `aerie describe` shows the blame of a job that ends too.
    blames, blame_why = blame_attempt(job, failed)
    recorded = api.call("POST", routes.attempt_blames(job["id"], number), {"blames": blames})

    replayed = nan_replay.recurred(job, failed)  # a NaN replayed at the same step: the data's
    if replayed is not None:
        return Decision(FAIL, "the NaN recurred", reason=replayed)
    verdict = classify(reason, spec)
    if verdict != RETRY:
        kind = reason.get("kind", FailureKind.EXIT_NONZERO)
        message = f"not retried: {verdict}. {reason.get('message', '')}".strip()
        return Decision(FAIL, verdict, reason={**reason, "kind": kind, "message": message})
    if budget.restarts_spent(spec, number):
        # The job fails with its last failure's own kind: that is the cause a person needs.
        spent = f"{number} attempt(s) failed, retry.max_restarts={budget.max_restarts(spec)}"
        message = f"{reason.get('message', '')} — {spent}".strip(" —")
        return Decision(FAIL, spent, reason={**reason, "retry_exhausted": True, "attempts": number, "message": message})

    exclude = budget.excluded_hosts(job, recorded, spec)
    left_out = budget.left_out_in_place(job, recorded, spec, blames)
    failure = strategies.Failure(job, failed, reason, left_out, list(failed.get("spares") or []))
    choice = strategies.choose(failure)
    resume_from, fallback = resume.last_good(spec, job, api, failed=number, mode=choice.mode)
    cause = {
        "event_id": event_id,
        "failed_attempt": number,
        "reason": reason,
        "blamed": [b["host"] for b in blames],
        "blame": blame_why,
        CAUSE_MODE: choice.mode.value,
        CAUSE_MODE_REASON: choice.why,
        **({CAUSE_REPLACED_NODES: choice.replaced} if choice.replaced else {}),
        **fallback,
    }
    body = {"number": number + 1, "resume_from": resume_from, "exclude_nodes": exclude, "cause": cause}
    summary = {
        "attempt": number + 1,
        "resume_from": resume_from,
        "exclude_nodes": exclude,
        "mode": choice.mode.value,
        "mode_reason": choice.why,
    }
    return Decision(RESTART, choice.why, attempt=body, summary=summary)
