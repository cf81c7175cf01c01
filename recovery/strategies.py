"""The ways a failed attempt's successor can start, as a registry tried in order.

Each strategy looks at the failure and either takes it (a `Choice`: the mode, why, and which
spare takes which failed node's slot) or passes. `DEFAULT_CHAIN` tries the cheapest first: the
same nodes in place, then a hot spare in the failed node's slot, then a relaunch (which always
takes it), so adding a strategy (elastic training's shrink) is one function and one name in the
chain. The rules themselves are `recovery.modes`'.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aerie_contracts.restarts import RestartMode
from recovery import modes


@dataclass(frozen=True)
class Failure:
    """What a strategy looks at: the job and its failed attempt as the API returns them, the
    failure's reason, the hosts the next attempt leaves out, and the failed attempt's hot spares."""

    job: dict[str, Any]
    failed: dict[str, Any]
    reason: dict[str, Any]
    left_out: list[str]
    spares: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Choice:
    strategy: str
    mode: RestartMode
    why: str
    replaced: dict[str, str] = field(default_factory=dict)  # failed host -> the spare in its slot


Strategy = Callable[[Failure], Choice | None]


def in_place(f: Failure) -> Choice | None:
    """The same nodes: the agents stay up and restart their worker groups."""
    mode, why = modes.decide(f.job, f.failed, f.reason, f.left_out)
    return Choice("in_place", mode, why) if mode == RestartMode.IN_PLACE else None


def spare_swap(f: Failure) -> Choice | None:
    """In place, a waiting hot spare in each lost or left-out node's rank slot."""
    mode, why, replaced = modes.with_spares(f.job, f.failed, f.reason, f.left_out, f.spares)
    return Choice("spare_swap", mode, why, replaced) if mode == RestartMode.IN_PLACE and replaced else None


def relaunch(f: Failure) -> Choice:
    """A new allocation without the excluded nodes; says why nothing cheaper could take it."""
    mode, why, _ = modes.with_spares(f.job, f.failed, f.reason, f.left_out, f.spares)
    if mode == RestartMode.IN_PLACE:  # only when the chain leaves the cheaper strategies out
        why = f"relaunched although {why}: in place is not in the job's strategies"
    return Choice("relaunch", RestartMode.RELAUNCH, why)


STRATEGIES: dict[str, Strategy] = {"in_place": in_place, "spare_swap": spare_swap, "relaunch": relaunch}
DEFAULT_CHAIN = ("in_place", "spare_swap", "relaunch")


def choose(f: Failure, chain: tuple[str, ...] = DEFAULT_CHAIN) -> Choice:
    """The first strategy of `chain` that takes the failure (a relaunch, if none does)."""
    for name in chain:
        choice = STRATEGIES[name](f)
        if choice is not None:
            return choice
    return relaunch(f)
