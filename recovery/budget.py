"""What a job may still spend: restarts (`retry.max_restarts`) and nodes (the hosts blamed
`retry.exclude_after_blames` times, not cleared since, are left out of later attempts). The
in-place budget (`retry.in_place_restarts`) is `recovery.modes.in_place_budget`."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

# Backends that provision fresh machines for every attempt: their host names (algo-1..N) are
# positions, not machines, so there is nothing to exclude; blame is still recorded.
REPLACES_NODES_ITSELF = frozenset({"sagemaker"})


def max_restarts(spec: dict[str, Any]) -> int:
    return int(spec.get("retry", {}).get("max_restarts", 0))


def restarts_spent(spec: dict[str, Any], failed_number: int) -> bool:
    """Whether attempt `failed_number` failing leaves no restart (attempt 1 is no restart)."""
    return failed_number - 1 >= max_restarts(spec)


def excluded_hosts(job: dict[str, Any], blames: list[dict[str, Any]], spec: dict[str, Any]) -> list[str]:
    """Hosts blamed (and not cleared since) at least `retry.exclude_after_blames` times in this job."""
    retry = spec.get("retry", {})
    if not retry.get("exclude_bad_nodes", True) or job.get("backend") in REPLACES_NODES_ITSELF:
        return []
    counts = Counter(b["host"] for b in blames if b.get("cleared_at") is None)
    return sorted(h for h, n in counts.items() if n >= int(retry.get("exclude_after_blames", 1)))


def left_out_in_place(
    job: dict[str, Any], recorded: list[dict[str, Any]], spec: dict[str, Any], blamed_now: Sequence[Mapping[str, Any]]
) -> list[str]:
    """The hosts an in-place successor must not run on. Where the backend replaces nodes itself
    nothing is excluded from a new launch, but in place a node this failure blamed (often enough)
    is the same machine again: it rules the in-place restart out."""
    if job.get("backend") not in REPLACES_NODES_ITSELF:
        return excluded_hosts(job, recorded, spec)
    now = {b.get("host") for b in blamed_now}
    return [h for h in excluded_hosts({**job, "backend": ""}, recorded, spec) if h in now]
