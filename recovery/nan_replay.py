"""NaN attribution by replay: the data's (or the model's) NaN, or a faulty device's?

Resume is bitwise deterministic (same seed, same data order, same world), so the attempt that
restarts after a `loss.nan` replays the step that produced it on the same data:

* the NaN **recurs at the same step** -> it is the data's or the model's: retrying again only burns
  the retry budget. Chaining stops the job as a user error naming the step and the samples the
  step read (`recurred`).
* the replayed step **passes with a finite loss** -> the first NaN was not reproducible: a suspected
  silent data corruption on the node whose rank produced it (its own loss, before the ranks'
  losses were combined, was the non-finite one). The controller records `sdc.suspect` against
  that node on the attempt that failed, and blames it (`sdc_suspect`), so later attempts leave it
  out; the replaying attempt runs on.

Facts come from the `loss.nan` verdicts (agent/detect.py: `step`, `rank`, `origin_ranks`,
`consumed_samples`). Standard library only (it runs in AWS Lambda with `chain_restart`).
"""

from __future__ import annotations

from typing import Any

from aerie_contracts.failures import BlameRule, FailureKind, NodeBlame, reason


def first_nan(verdicts: list[dict[str, Any]], attempt_id: str) -> dict[str, Any] | None:
    """The attempt's first NaN: `{"step", "host", "rank", "consumed_samples"}`; `host` is the node
    whose rank produced it when a node said so (else None)."""
    nans = [
        v
        for v in verdicts
        if v.get("attempt_id") == attempt_id
        and v.get("kind") == FailureKind.LOSS_NAN
        and isinstance((v.get("evidence") or {}).get("step"), int)
    ]
    if not nans:
        return None
    step = min(v["evidence"]["step"] for v in nans)
    at = [v for v in nans if v["evidence"]["step"] == step]
    origin = [v for v in at if v["evidence"].get("origin_ranks")]
    named = origin[0] if len(origin) == 1 else None  # two nodes each producing one: no single culprit
    consumed = next((v["evidence"].get("consumed_samples") for v in at if v["evidence"].get("consumed_samples")), None)
    return {
        "step": step,
        "host": named["host"] if named else None,
        "rank": named["evidence"]["origin_ranks"][0] if named else None,
        "consumed_samples": consumed,
    }


def samples_of(step: int, consumed: Any) -> list[int] | None:
    """The data order's samples `[first, end)` that `step` read (global batches are constant, so
    `consumed_samples / step` samples a step)."""
    if not isinstance(consumed, int) or step <= 0 or consumed % step:
        return None
    return [consumed - consumed // step, consumed]


def recurred(job: dict[str, Any], failed: dict[str, Any]) -> dict[str, Any] | None:
    """The failure reason that ends the job when `failed` (an attempt that failed with `loss.nan`)
    replayed the NaN of the attempt before it at the same step; None otherwise."""
    if (failed.get("reason") or {}).get("kind") != FailureKind.LOSS_NAN:
        return None
    previous = next((a for a in job["attempt_list"] if a["number"] == failed["number"] - 1), None)
    if previous is None or (previous.get("reason") or {}).get("kind") != FailureKind.LOSS_NAN:
        return None
    verdicts = job.get("verdicts") or []
    now, before = first_nan(verdicts, failed["id"]), first_nan(verdicts, previous["id"])
    if now is None or before is None or now["step"] != before["step"]:
        return None
    samples = samples_of(now["step"], now["consumed_samples"] or before["consumed_samples"])
    where = f", samples [{samples[0]}, {samples[1]}) of the data order" if samples else ""
    return reason(
        FailureKind.USER_ERROR,
        f"loss.nan recurs at step {now['step']} after a deterministic resume (attempts {previous['number']} "
        f"and {failed['number']}){where}: the data or the model, not the hardware",
        step=now["step"],
        data_index=samples,
        evidence={"nan": now, "previous": before, "replay": "recurred"},
    )


def sdc_suspect(
    nan: dict[str, Any], replay_attempt: int, summaries: dict[str, dict[str, Any]], completed: bool = False
) -> tuple[dict[str, Any], NodeBlame | None] | None:
    """(verdict, blame) once every node of the replaying attempt is past the NaN's step with a
    finite loss, or the attempt `completed` (it trained every step, the NaN's too, and no
    `loss.nan` ended it); None while it is not (or if it cannot tell)."""
    if not summaries and not completed:
        return None
    for s in [] if completed else summaries.values():
        last, loss = s.get("last_step"), s.get("last_loss")
        if not isinstance(last, int) or last <= nan["step"] or not isinstance(loss, (int, float)):
            return None
    who = f"rank {nan['rank']} on {nan['host']}" if nan["host"] else "an unknown rank"
    message = (
        f"the NaN at step {nan['step']} did not recur when attempt {replay_attempt} replayed it on the same data: "
        f"suspected silent data corruption by {who}"
    )
    evidence = {**nan, "replay_attempt": replay_attempt, "replay": "did not recur"}
    verdict = {
        "kind": FailureKind.SDC_SUSPECT.value,
        "host": nan["host"] or "",
        "message": message,
        "evidence": evidence,
    }
    if not nan["host"]:
        return verdict, None
    blame: NodeBlame = {
        "host": nan["host"],
        "kind": FailureKind.SDC_SUSPECT.value,
        "rule": BlameRule.REPORTED.value,
        "why": message,
        "evidence": evidence,
    }
    return verdict, blame
