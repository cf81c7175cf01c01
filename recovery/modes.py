"""In place, a spare swap, or a relaunch: how the next attempt starts, and what the control plane
may assume of it before the decision is made.

In place when the failed attempt's nodes are still fit to run it again (a rank crash, a hang, a
NaN that may not recur, a blame that does not yet exclude its node): the agents stay up and
restart only their worker groups, with no new allocation and no node boot. A relaunch otherwise:
a backend that cannot keep its agents, a lost node, a node the next attempt must leave out (blamed
`retry.exclude_after_blames` times: by default its first blame), or `retry.in_place_restarts`
consecutive in-place restarts already spent (a fault that survives in place that often may live
in the allocation itself). With hot spares (`resources.spare_nodes`), a relaunch forced by a lost,
preempted, pre-flight-failed or excluded node becomes an in-place attempt after all: the surviving
nodes restart their worker groups and a waiting spare takes each failed node's rank slot
(`with_spares`).

Before chaining decides, the control plane asks this module too: whether a job's agents outlive
their worker groups at all (`in_place_on`, `not_in_place`), whether a failed attempt's agents are
kept up for a possible in-place successor (`keeps_warm`), and whether the memory tier runs
(`memory_tier_off`: its snapshots serve in-place restarts). Standard library only (Lambda bundle).
"""

from __future__ import annotations

from typing import Any

from aerie_contracts.backends import capabilities
from aerie_contracts.restarts import (
    DEFAULT_IN_PLACE_RESTARTS,
    NOT_REUSABLE,
    SPARE_REPAIRS,
    RestartMode,
    mode_of,
)


def decide(
    job: dict[str, Any], failed: dict[str, Any], reason: dict[str, Any], exclude: list[str]
) -> tuple[RestartMode, str]:
    """(mode, why) for the attempt after `failed`; `exclude` are the hosts the next attempt leaves
    out (blamed often enough: `recovery.budget.excluded_hosts`)."""
    backend = job.get("backend", "")
    if not capabilities(backend).in_place:
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
    budget = in_place_budget(job.get("spec") or {})
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
    if not capabilities(job.get("backend", "")).in_place or not_in_place(job.get("spec") or {}):
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
    budget = in_place_budget(job.get("spec") or {})
    done = in_place_streak(job["attempt_list"], failed["number"])
    if done >= budget:
        return mode, why, {}
    replaced = dict(zip(sorted(gone), spares))
    swaps = ", ".join(f"{spare} for {host}" for host, spare in replaced.items())
    why = f"{why}; hot spare(s) take the slot(s): {swaps} (in place {done + 1} of {budget})"
    return RestartMode.IN_PLACE, why, replaced


def not_in_place(spec: dict[str, Any]) -> str | None:
    """Why a job's spec rules in-place restarts out (None: it does not)."""
    if (spec.get("backend_options") or {}).get("netns"):
        return "network namespaces (backend_options.netns) are made per attempt"
    return None


def may_restart_in_place(backend: str, reason: dict[str, Any] | None, budget: int) -> bool:
    """Whether a failed attempt could still be followed in place, before blame is known: the
    controller keeps its agents up until chaining decides (it tears them down on a relaunch)."""
    kind = (reason or {}).get("kind")
    return capabilities(backend).in_place and budget > 0 and kind not in NOT_REUSABLE


def may_take_spare(backend: str, reason: dict[str, Any] | None, budget: int, spares: list[str]) -> bool:
    """Whether a failed attempt that cannot be reused as it is may still be followed in place, a
    hot spare taking the failed node's slot: the controller keeps the survivors' agents up."""
    kind = (reason or {}).get("kind")
    caps = capabilities(backend)
    return caps.in_place and caps.hot_spares and budget > 0 and bool(spares) and kind in SPARE_REPAIRS


def memory_tier_off(spec: dict[str, Any], backend: str) -> str | None:
    """Why a job takes no in-memory checkpoints (None: it does). They serve restarts on warm nodes,
    so they run where in-place restarts do, with a peer node to hold each node's replica."""
    every = (spec.get("checkpoint") or {}).get("memory_every_steps", "auto")
    if every in (0, "0"):
        return "checkpoint.memory_every_steps is 0"
    if not capabilities(backend).in_place:
        return f"the {backend} backend does not restart in place yet"
    if not capabilities(backend).memory_tier:
        return f"the {backend} backend has no in-memory checkpoint tier yet"
    if (spec.get("retry") or {}).get("max_restarts") == 0:
        return "retry.max_restarts is 0: no attempt would resume from them"
    if in_place_budget(spec) <= 0:
        return "retry.in_place_restarts is 0"
    if int((spec.get("resources") or {}).get("instance_count", 1)) < 2:
        return "one node: no peer to hold a replica"
    if (spec.get("checkpoint") or {}).get("marker"):
        # Aerie snapshots only the state its own trainer hands it; a third-party trainer's
        # checkpoints are its own files (in place, it finds them where it left them).
        return "a third-party trainer's checkpoints (checkpoint.marker) are its own files"
    return not_in_place(spec)


def in_place_budget(spec: dict[str, Any]) -> int:
    """`retry.in_place_restarts`: consecutive in-place restarts before a relaunch (0: never)."""
    return int((spec.get("retry") or {}).get("in_place_restarts", DEFAULT_IN_PLACE_RESTARTS))


def in_place_on(spec: dict[str, Any]) -> bool:
    """Whether the job's agents outlive their worker groups (in-place restarts, hot spares)."""
    retry = spec.get("retry") or {}
    return int(retry.get("max_restarts", 0)) > 0 and in_place_budget(spec) > 0 and not not_in_place(spec)


def keeps_warm(spec: dict[str, Any], backend: str, reason: dict[str, Any] | None, spares: list[str]) -> bool:
    """Whether a failed attempt's agents stay up for chaining to restart it in place (before blame
    is known): a failure that leaves the allocation reusable, or a lost node a hot spare may replace."""
    if not_in_place(spec):
        return False
    budget = in_place_budget(spec)
    return may_restart_in_place(backend, reason, budget) or may_take_spare(backend, reason, budget, spares)
