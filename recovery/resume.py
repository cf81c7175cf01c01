"""Where the next attempt resumes: the newest good checkpoint, across the tiers, that survives the
way it starts (`recovery.modes`).

S3's checkpoints survive anything; the control plane's record says which are good (fencing: a
superseded attempt's commit is never recorded), and S3 is checked to still back them (a recorded
one it no longer backs is reported `bad`, so the record tells the truth). A memory checkpoint
survives only where the memory that holds it does. Reads and reports go through the API (the
`Transport` the handler passes in: one call, a method, a path and a JSON body).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from aerie_contracts import routes
from aerie_contracts.backends import capabilities
from aerie_contracts.checkpoints import MEMORY_GONE_LOST, CheckpointTier, expired_memory, step_of_uri
from aerie_contracts.restarts import (
    CAUSE_MEMORY_NODES,
    CAUSE_RESUME_FALLBACK,
    RestartMode,
    mode_of,
)
from aerie_contracts.states import CheckpointState

if TYPE_CHECKING:  # for annotations only: at run time it is imported where used
    from aerie_checkpoint.manifest import CheckpointInfo


class Transport(Protocol):
    """The API as the recovery package needs it (lambdas.api.Api is one)."""

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any: ...


def last_good_checkpoint(spec: dict[str, Any], job_id: str, api: Transport | None = None) -> str | None:
    """The newest verified checkpoint of the job, or None (start from scratch).

    With the API, only checkpoints the control plane recorded count (fencing: a superseded
    attempt's commit is never recorded), and recorded ones that fail verification in S3 are
    reported `bad`, so the record tells the truth and the next decision skips them."""
    ckpt = spec.get("checkpoint") or {}
    if not ckpt.get("s3_uri"):
        return None
    from aerie_checkpoint.manifest import list_checkpoints

    prefix = ckpt["s3_uri"].rstrip("/") + "/" + job_id
    recorded = recorded_checkpoints(api, job_id) if api is not None else None
    infos = list_checkpoints(prefix, recorded)
    if api is not None and recorded is not None:
        report_unverified(api, job_id, recorded, infos)
    good = [i for i in infos if i.good]
    return good[-1].uri if good else None


def last_good(
    spec: dict[str, Any], job: dict[str, Any], api: Transport, *, failed: int, mode: RestartMode
) -> tuple[str | None, dict[str, Any]]:
    """The resume point of attempt `failed` + 1 across the tiers, and the cause's memory fields:
    the newest good checkpoint that survives the restart `mode`. S3's always does. A memory
    checkpoint does only where the memory that holds it is still there: the nodes stay (in place)
    or keep their memory across a relaunch (`Capabilities.memory_outlives_relaunch`), and it was written by an
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
    outlives = capabilities(job.get("backend") or "").memory_outlives_relaunch
    by_number = {int(a["number"]): a for a in job.get("attempt_list", [])}
    survivors: set[str] = set()
    kept = mode == RestartMode.IN_PLACE or outlives
    number = failed
    while kept and number in by_number:
        survivors.add(str(by_number[number].get("id")))
        kept = outlives or mode_of(by_number[number].get("cause")) == RestartMode.IN_PLACE
        number -= 1
    return survivors


def _mark_memory_gone(api: Transport, job_id: str, attempts: list[str], reason: str) -> None:
    rows = api.call("GET", routes.job_checkpoints(job_id) + "?limit=10000") or []
    gone = expired_memory(rows, lost_attempts=set(attempts))
    if gone:
        body = {"uris": sorted(gone), "state": CheckpointState.DELETED.value, "reason": reason}
        api.call("POST", routes.job_checkpoint_states(job_id), body)


def last_good_memory_checkpoint(
    api: Transport, job_id: str, attempts: set[str] | None = None
) -> tuple[str, dict[str, Any]] | None:
    """The job's newest memory checkpoint that the control plane recorded good (both copies of
    every rank's snapshot complete), written by one of `attempts` (None: any), with which node
    wrote which ranks and holds whose replica; or None."""
    rows = api.call("GET", routes.job_checkpoints(job_id) + "?limit=10000") or []
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


def recorded_checkpoints(api: Transport, job_id: str) -> dict[str, str]:
    """The control plane's record of the job's checkpoints: {uri: state}."""
    rows = api.call("GET", routes.job_checkpoints(job_id) + "?limit=10000") or []
    # S3-tier rows only: a memory checkpoint has no objects to verify (and must not be reported bad
    # for it); choosing a memory resume point is the in-place restart's decision, not this one.
    s3 = CheckpointTier.S3.value
    return {str(r["uri"]).rstrip("/"): r["state"] for r in rows if r.get("tier", s3) == s3}


def report_unverified(api: Transport, job_id: str, recorded: dict[str, str], infos: list[CheckpointInfo]) -> list[str]:
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
        api.call("POST", routes.job_checkpoint_states(job_id), body)
        bad.append(uri)
    return bad
