"""In place or relaunch: how chain_restart's next attempt starts (`aerie_contracts.restarts`).

In place when the failed attempt's nodes are still fit to run it again (a rank crash, a hang, a
NaN that may not recur, a blame that does not yet exclude its node): the agents stay up and
restart only their worker groups, with no new allocation and no node boot. A relaunch otherwise:
a backend that cannot keep its agents, a lost node, a node the next attempt must leave out (blamed
`retry.exclude_after_blames` times: by default its first blame), or `retry.in_place_restarts`
consecutive in-place restarts already spent (a fault that survives in place that often may live
in the allocation itself). With hot spares (`resources.spare_nodes`), a relaunch forced by a lost,
preempted, pre-flight-failed or excluded node becomes an in-place attempt after all: the surviving
nodes restart their worker groups and a waiting spare takes each failed node's rank slot
(`with_spares`). Standard library only (Lambda bundle).
"""

from __future__ import annotations

from typing import Any

from aerie_contracts.restarts import (
    DEFAULT_IN_PLACE_RESTARTS,
    IN_PLACE_BACKENDS,
    NOT_REUSABLE,
    SPARE_REPAIRS,
    RestartMode,
    mode_of,
    not_in_place,
)


def decide(
    job: dict[str, Any], failed: dict[str, Any], reason: dict[str, Any], exclude: list[str]
) -> tuple[RestartMode, str]:
    """(mode, why) for the attempt after `failed`; `exclude` are the hosts the next attempt leaves
    out (blamed often enough: `chain_restart.excluded_hosts`)."""
    backend = job.get("backend", "")
    if backend not in IN_PLACE_BACKENDS:
        return RestartMode.RELAUNCH, f"the {backend} backend relaunches every attempt"
    ruled_out = not_in_place(job.get("spec") or {})
    if ruled_out:
        return RestartMode.RELAUNCH, ruled_out
    kind = reason.get("kind") or ""
    if kind in NOT_REUSABLE:
        where = f" ({reason['host']})" if reason.get("host") else ""
        return RestartMode.RELAUNCH, f"{kind}{where}: the allocation cannot be reused"
    hosts = sorted({n["host"] for n in failed.get("nodes") or []})
    if not hosts:
        return RestartMode.RELAUNCH, "the failed attempt had no nodes to reuse"
    bad = sorted(set(exclude) & set(hosts))
    if bad:
        return RestartMode.RELAUNCH, f"blamed node(s) {', '.join(bad)} excluded: a new allocation leaves them out"
    budget = int((job.get("spec") or {}).get("retry", {}).get("in_place_restarts", DEFAULT_IN_PLACE_RESTARTS))
    done = in_place_streak(job["attempt_list"], failed["number"])
    if done >= budget:
        return RestartMode.RELAUNCH, f"{done} in-place restart(s) in a row: retry.in_place_restarts={budget} spent"
    why = f"{kind or 'a failure'} on healthy nodes ({', '.join(hosts)}): in-place restart {done + 1} of {budget}"
    return RestartMode.IN_PLACE, why


def in_place_streak(attempts: list[dict[str, Any]], number: int) -> int:
    """How many attempts up to `number` were, in a row, restarted in place."""
    by_number = {a["number"]: a for a in attempts}
    streak = 0
    while number in by_number and mode_of(by_number[number].get("cause")) == RestartMode.IN_PLACE:
        streak += 1
        number -= 1
    return streak


def with_spares(
    job: dict[str, Any], failed: dict[str, Any], reason: dict[str, Any], exclude: list[str], spares: list[str]
) -> tuple[RestartMode, str, dict[str, str]]:
    """`decide`, and where it relaunches only because nodes failed or are left out: in place with
    the failed attempt's hot spares (`spares`, in their order) in those nodes' rank slots. Returns
    (mode, why, {replaced host: spare host})."""
    mode, why = decide(job, failed, reason, exclude)
    if mode == RestartMode.IN_PLACE or not spares:
        return mode, why, {}
    if job.get("backend", "") not in IN_PLACE_BACKENDS or not_in_place(job.get("spec") or {}):
        return mode, why, {}
    kind = reason.get("kind") or ""
    if kind in NOT_REUSABLE and kind not in SPARE_REPAIRS:
        return mode, why, {}  # the attempt never had its nodes: nothing to go on with
    hosts = [n["host"] for n in failed.get("nodes") or []]
    gone = set(exclude) & set(hosts)
    if kind in SPARE_REPAIRS and reason.get("host") in hosts:
        gone.add(reason["host"])  # lost or unfit, excluded or not: its tree is gone (fenced)
    if not gone:
        return mode, why, {}
    if len(gone) > len(spares):
        return mode, f"{why}; {len(gone)} node(s) to replace, {len(spares)} hot spare(s)", {}
    budget = int((job.get("spec") or {}).get("retry", {}).get("in_place_restarts", DEFAULT_IN_PLACE_RESTARTS))
    done = in_place_streak(job["attempt_list"], failed["number"])
    if done >= budget:
        return mode, why, {}
    replaced = dict(zip(sorted(gone), spares))
    swaps = ", ".join(f"{spare} for {host}" for host, spare in replaced.items())
    why = f"{why}; hot spare(s) take the slot(s): {swaps} (in place {done + 1} of {budget})"
    return RestartMode.IN_PLACE, why, replaced
