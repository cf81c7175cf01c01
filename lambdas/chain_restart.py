"""On a failed attempt: restart the job from its last good checkpoint, or end it.

Triggered by "Aerie Attempt State Change" events with state Failed (and by SageMaker's own
"SageMaker Training Job State Change" events, mapped onto the same shape). Decides, in order:
  1. stale or irrelevant event (not the latest attempt, job already over) -> nothing;
  2. the user's fault (`user.error`, an exit code the spec marks non-retryable, a `loss.nan` that
     recurs at the same step after a resume: `lambdas/nan_replay.py`) -> job Failed;
  3. retry budget (`retry.max_restarts`) spent -> job Failed with the last failure's reason;
  4. otherwise -> attempt N+1, resuming from `last_good` across the tiers (the newest good
     checkpoint that survives the restart mode: a memory one with S3's as its fallback, or S3's) and
     excluding every node blamed `retry.exclude_after_blames` times (blames not yet cleared),
     started in place (the same nodes, only the worker groups restarted; with hot spares, a spare
     in each lost or excluded node's rank slot) or relaunched, with the reason, in its `cause`
     (`lambdas/restart_mode.py`).
Whether a failure is retried, and whether it can blame a node at all, is the policy table of
`aerie_contracts.failures`; which node a failure blames comes from the evidence
(`lambdas/blame.py`), and is recorded through the API before the decision, whatever it is, so
`aerie describe` shows it. Idempotent: a blame is recorded once per (attempt, host), and attempt
N+1 is created by the store under a (job, number) unique constraint, so a redelivered or
duplicated event gets 409 and changes nothing.
"""

from __future__ import annotations

import logging
import urllib.parse
from collections import Counter
from typing import TYPE_CHECKING, Any

from aerie_contracts.checkpoints import MEMORY_GONE_LOST, CheckpointTier, expired_memory, step_of_uri
from aerie_contracts.events import DetailType
from aerie_contracts.failures import FailureKind, policy
from aerie_contracts.restarts import (
    CAUSE_MEMORY_NODES,
    CAUSE_MODE,
    CAUSE_MODE_REASON,
    CAUSE_REPLACED_NODES,
    CAUSE_RESUME_FALLBACK,
    MEMORY_OUTLIVES_RELAUNCH,
    RestartMode,
    mode_of,
)
from aerie_contracts.states import JOB_TERMINAL, AttemptState, CheckpointState
from lambdas import nan_replay, restart_mode
from lambdas.api import Api, ApiError
from lambdas.blame import blame_attempt

if TYPE_CHECKING:  # for annotations only: at run time it is imported where used, as before
    from trainer.checkpoint.manifest import CheckpointInfo

log = logging.getLogger("aerie.lambdas.chain_restart")

SAGEMAKER_STATE_CHANGE = DetailType.SAGEMAKER_TRAINING_JOB_STATE_CHANGE.value
# Backends that provision fresh machines for every attempt: their host names (algo-1..N) are
# positions, not machines, so there is nothing to exclude; blame is still recorded.
REPLACES_NODES_ITSELF = frozenset({"sagemaker"})


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    detail = _attempt_detail(event)
    if detail is None or detail.get("state") != AttemptState.FAILED:
        return {"action": "none", "why": "not an attempt failure"}
    api = Api.from_context(context)
    job = api.job(detail["job_id"])
    if job["state"] in JOB_TERMINAL:
        return {"action": "none", "why": f"job already {job['state']}"}
    attempts = job["attempt_list"]
    latest = max(a["number"] for a in attempts)
    number = int(detail["attempt"])
    if number != latest:
        return {"action": "none", "why": f"attempt {number} is not the latest ({latest})"}
    failed = next(a for a in attempts if a["number"] == number)
    if failed["state"] != AttemptState.FAILED:
        # SageMaker's own event may beat the control plane's poll; the control plane's event for
        # the same failure follows once it records it, and is handled then.
        return {"action": "none", "why": f"attempt {number} is {failed['state']} in the store, not Failed yet"}
    spec = job["spec"]
    reason = failed.get("reason") or detail.get("reason") or {}

    blames, blame_why = blame_attempt(job, failed)
    recorded = api.call("POST", f"/v1/jobs/{job['id']}/attempts/{number}/blames", {"blames": blames})

    # A NaN replayed at the same step after a deterministic resume: the data's or the model's.
    replayed = nan_replay.recurred(job, failed)
    if replayed is not None:
        return _fail(api, job, replayed)

    verdict = classify(reason, spec)
    if verdict != "retry":
        return _fail(
            api,
            job,
            {
                **reason,
                "kind": reason.get("kind", FailureKind.EXIT_NONZERO),
                "message": f"not retried: {verdict}. {reason.get('message', '')}".strip(),
            },
        )
    max_restarts = int(spec.get("retry", {}).get("max_restarts", 0))
    if number - 1 >= max_restarts:
        # The job fails with its last failure's own kind: that is the cause a person needs.
        return _fail(
            api,
            job,
            {
                **reason,
                "retry_exhausted": True,
                "attempts": number,
                "message": f"{reason.get('message', '')} — {number} attempt(s) failed, "
                f"retry.max_restarts={max_restarts}".strip(" —"),
            },
        )

    exclude = excluded_hosts(job, recorded, spec)
    left_out = exclude
    if job.get("backend") in REPLACES_NODES_ITSELF:
        # Nothing to exclude from a new launch, but in place a node this failure blamed (often
        # enough) is the same machine again: it rules the in-place restart out.
        now = {b.get("host") for b in blames}
        left_out = [h for h in excluded_hosts({**job, "backend": ""}, recorded, spec) if h in now]
    # Hot spares (resources.spare_nodes) of the failed attempt may take failed nodes' slots in place.
    spares = list(failed.get("spares") or [])
    mode, mode_why, replaced = restart_mode.with_spares(job, failed, reason, left_out, spares)
    resume_from, fallback = last_good(spec, job, api, failed=number, mode=mode)
    body = {
        "number": number + 1,
        "resume_from": resume_from,
        "exclude_nodes": exclude,
        "cause": {
            "event_id": event.get("id"),
            "failed_attempt": number,
            "reason": reason,
            "blamed": [b["host"] for b in blames],
            "blame": blame_why,
            CAUSE_MODE: mode.value,
            CAUSE_MODE_REASON: mode_why,
            **({CAUSE_REPLACED_NODES: replaced} if replaced else {}),
            **fallback,
        },
    }
    try:
        api.call("POST", f"/v1/jobs/{job['id']}/attempts", body)
    except ApiError as exc:
        if exc.status == 409:  # someone (a redelivery) already created it
            return {"action": "none", "why": "attempt already created"}
        raise
    log.info(
        "job %s: attempt %d failed (%s); attempt %d resumes from %s, %s: %s",
        job["id"],
        number,
        reason.get("kind"),
        number + 1,
        resume_from or "scratch",
        mode.value,
        mode_why,
    )
    return {
        "action": "restart",
        "attempt": number + 1,
        "resume_from": resume_from,
        "exclude_nodes": exclude,
        "mode": mode.value,
        "mode_reason": mode_why,
    }


def classify(reason: dict[str, Any], spec: dict[str, Any]) -> str:
    """'retry', or why not (the policy table of `aerie_contracts.failures`, and the spec's
    `retry.non_retryable_exit_codes` for an exit code that was not a signal)."""
    kind = reason.get("kind") or FailureKind.EXIT_NONZERO.value
    rule = policy(kind)
    if rule is None:
        return f"failure kind {kind!r} is not a known kind"
    if rule.user_error:
        return f"the job's input or code is wrong ({kind})"
    if kind == FailureKind.EXIT_NONZERO and not reason.get("signal"):
        code = reason.get("exit_code")
        if code in set(spec.get("retry", {}).get("non_retryable_exit_codes", [])):
            return f"exit code {code} is marked non-retryable in retry.non_retryable_exit_codes"
    if not rule.retry:
        return f"failure kind {kind!r} is not retryable ({rule.meaning})"
    return "retry"


def last_good_checkpoint(spec: dict[str, Any], job_id: str, api: Api | None = None) -> str | None:
    """The newest verified checkpoint of the job, or None (start from scratch).

    With the API, only checkpoints the control plane recorded count (fencing: a superseded
    attempt's commit is never recorded), and recorded ones that fail verification in S3 are
    reported `bad`, so the record tells the truth and the next decision skips them."""
    ckpt = spec.get("checkpoint") or {}
    if not ckpt.get("s3_uri"):
        return None
    from trainer.checkpoint.manifest import list_checkpoints

    prefix = ckpt["s3_uri"].rstrip("/") + "/" + job_id
    recorded = recorded_checkpoints(api, job_id) if api is not None else None
    infos = list_checkpoints(prefix, recorded)
    if api is not None and recorded is not None:
        report_unverified(api, job_id, recorded, infos)
    good = [i for i in infos if i.good]
    return good[-1].uri if good else None


def last_good(
    spec: dict[str, Any], job: dict[str, Any], api: Api, *, failed: int, mode: RestartMode
) -> tuple[str | None, dict[str, Any]]:
    """The resume point of attempt `failed` + 1 across the tiers, and the cause's memory fields:
    the newest good checkpoint that survives the restart `mode`. S3's always does. A memory
    checkpoint does only where the memory that holds it is still there: the nodes stay (in place)
    or keep their memory across a relaunch (`MEMORY_OUTLIVES_RELAUNCH`), and it was written by an
    attempt whose successors up to this one all kept it (`memory_survivors`). It is newer than
    S3's (taken far more often), and restoring it reads nothing from S3 (a replaced node fetches
    its ranks' replicas from the nodes that hold them); S3's stays the fallback should any rank's
    copy be gone or fail its checksum. A relaunch that loses the memory marks its records gone."""
    durable = last_good_checkpoint(spec, job["id"], api)
    survivors = memory_survivors(job, failed, mode)
    if not survivors:
        lost = [a["id"] for a in job.get("attempt_list", []) if a.get("id")]
        _mark_memory_gone(api, job["id"], lost, MEMORY_GONE_LOST)
        return durable, {}
    memory = last_good_memory_checkpoint(api, job["id"], survivors)
    # At the same step too: the memory copy restores without a single S3 request.
    if memory is None or (step_of_uri(memory[0]) or 0) < (step_of_uri(durable or "") or 0):
        return durable, {}
    return memory[0], {CAUSE_RESUME_FALLBACK: durable, CAUSE_MEMORY_NODES: memory[1]}


def memory_survivors(job: dict[str, Any], failed: int, mode: RestartMode) -> set[str]:
    """The attempts whose memory checkpoints attempt `failed` + 1 may restore (`mode`: its
    restart's): the failed one, if its nodes' memory survives the restart, and each earlier one
    whose successor kept it in turn (started in place, or on a backend whose relaunch keeps it)."""
    outlives = job.get("backend") in MEMORY_OUTLIVES_RELAUNCH
    by_number = {int(a["number"]): a for a in job.get("attempt_list", [])}
    survivors: set[str] = set()
    kept = mode == RestartMode.IN_PLACE or outlives
    number = failed
    while kept and number in by_number:
        survivors.add(str(by_number[number].get("id")))
        kept = outlives or mode_of(by_number[number].get("cause")) == RestartMode.IN_PLACE
        number -= 1
    return survivors


def _mark_memory_gone(api: Api, job_id: str, attempts: list[str], reason: str) -> None:
    rows = api.call("GET", f"/v1/jobs/{urllib.parse.quote(job_id)}/checkpoints?limit=10000") or []
    gone = expired_memory(rows, lost_attempts=set(attempts))
    if gone:
        body = {"uris": sorted(gone), "state": CheckpointState.DELETED.value, "reason": reason}
        api.call("POST", f"/v1/jobs/{urllib.parse.quote(job_id)}/checkpoints/state", body)


def last_good_memory_checkpoint(
    api: Api, job_id: str, attempts: set[str] | None = None
) -> tuple[str, dict[str, Any]] | None:
    """The job's newest memory checkpoint that the control plane recorded good (both copies of
    every rank's snapshot complete), written by one of `attempts` (None: any), with which node
    wrote which ranks and holds whose replica; or None."""
    rows = api.call("GET", f"/v1/jobs/{urllib.parse.quote(job_id)}/checkpoints?limit=10000") or []
    good = [
        r
        for r in rows
        if r.get("tier") == CheckpointTier.MEMORY.value
        and r.get("state") == CheckpointState.GOOD.value
        and (attempts is None or r.get("attempt_id") in attempts)
    ]
    if not good:
        return None
    newest = max(good, key=lambda r: int(r["step"]))
    return str(newest["uri"]), dict((newest.get("meta") or {}).get("nodes") or {})


def recorded_checkpoints(api: Api, job_id: str) -> dict[str, str]:
    """The control plane's record of the job's checkpoints: {uri: state}."""
    rows = api.call("GET", f"/v1/jobs/{urllib.parse.quote(job_id)}/checkpoints?limit=10000") or []
    # S3-tier rows only: a memory checkpoint has no objects to verify (and must not be reported bad
    # for it); choosing a memory resume point is the in-place restart's decision, not this one.
    s3 = CheckpointTier.S3.value
    return {str(r["uri"]).rstrip("/"): r["state"] for r in rows if r.get("tier", s3) == s3}


def report_unverified(api: Api, job_id: str, recorded: dict[str, str], infos: list[CheckpointInfo]) -> list[str]:
    """Recorded-good checkpoints that S3 no longer backs (objects missing or resized, manifest
    gone) are `bad`: tell the control plane, with the reasons."""
    seen = {i.uri.rstrip("/"): i for i in infos}
    bad = []
    for uri, state in recorded.items():
        info = seen.get(uri)
        if state != "good" or (info is not None and info.good):
            continue
        reasons = info.reasons if info is not None else ["no object left under it"]
        body = {"uris": [uri], "state": "bad", "reason": "verification failed: " + "; ".join(reasons)[:900]}
        api.call("POST", f"/v1/jobs/{urllib.parse.quote(job_id)}/checkpoints/state", body)
        bad.append(uri)
    return bad


def excluded_hosts(job: dict[str, Any], blames: list[dict[str, Any]], spec: dict[str, Any]) -> list[str]:
    """Hosts blamed (and not cleared since) at least `retry.exclude_after_blames` times in this job."""
    retry = spec.get("retry", {})
    if not retry.get("exclude_bad_nodes", True) or job.get("backend") in REPLACES_NODES_ITSELF:
        return []
    counts = Counter(b["host"] for b in blames if b.get("cleared_at") is None)
    return sorted(h for h, n in counts.items() if n >= int(retry.get("exclude_after_blames", 1)))


def _fail(api: Api, job: dict[str, Any], reason: dict[str, Any]) -> dict[str, Any]:
    api.call("POST", f"/v1/jobs/{job['id']}/fail", {"reason": reason})
    return {"action": "fail", "reason": reason}


def _attempt_detail(event: dict[str, Any]) -> dict[str, Any] | None:
    if event.get("detail-type") == DetailType.ATTEMPT_STATE_CHANGE:
        return event.get("detail") or {}
    if event.get("detail-type") == SAGEMAKER_STATE_CHANGE:
        from lambdas.sagemaker_events import event_from_sagemaker

        mapped = event_from_sagemaker(event)
        return (mapped or {}).get("detail")
    return None
