"""Which named nodes an attempt runs on, when some are excluded: the local backend's node pool.

The local backend emulates a cluster of `backend_options.node_slots` named nodes `algo-1..algo-K`
(default: the job's `instance_count` plus one spare). An attempt takes the first `instance_count`
slots that chaining has not excluded, so a blamed node is left out and a spare takes its place,
as it would on a real cluster. When too few slots are left the attempt fails with
`placement.failed` and says which nodes were excluded: it never shrinks the job silently.
(Slurm excludes with `--exclude` and says the same through sbatch; SageMaker provisions the
instances of every attempt itself, so it has nothing to exclude.)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from aerie_contracts.failures import FailureKind

SLOT_PREFIX = "algo-"  # SageMaker's host names, which the local backend mirrors
DEFAULT_SPARES = 1
MAX_SLOTS = 4096 + DEFAULT_SPARES  # resources.instance_count's bound, plus the default spare


class PlacementError(RuntimeError):
    """Too few usable nodes for the attempt; the controller fails it with this failure kind."""

    failure_kind = FailureKind.PLACEMENT_FAILED.value


def node_slots(options: Mapping[str, Any], instance_count: int, spare_nodes: int = 0) -> int:
    """How many named nodes the local pool has: `backend_options.node_slots`, checked, or the
    job's node count and its hot spares (`resources.spare_nodes`) plus one slot to spare. Raises
    ValueError naming the field."""
    raw = options.get("node_slots")
    if raw is None:
        return instance_count + spare_nodes + DEFAULT_SPARES
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise ValueError(f"backend_options.node_slots must be an integer, not {raw!r}")
    if not instance_count + spare_nodes <= raw <= MAX_SLOTS + spare_nodes:
        raise ValueError(
            f"backend_options.node_slots must be between resources.instance_count ({instance_count}) plus "
            f"resources.spare_nodes ({spare_nodes}) and {MAX_SLOTS + spare_nodes}, got {raw}"
        )
    return raw


def slot_names(slots: int) -> list[str]:
    return [f"{SLOT_PREFIX}{i + 1}" for i in range(slots)]


def place(count: int, slots: int, exclude: Iterable[str] = ()) -> list[str]:
    """The first `count` slot names not in `exclude`, in slot order (the first is node rank 0)."""
    excluded = set(exclude)
    names = slot_names(slots)
    usable = [h for h in names if h not in excluded]
    if len(usable) < count:
        left_out = [h for h in names if h in excluded]
        raise PlacementError(
            f"cannot place {count} node(s): the pool has {slots} node slot(s) and {len(left_out)} are excluded "
            f"after blame ({', '.join(left_out)}); give the job spare slots (backend_options.node_slots) "
            "or tolerate more blame before excluding (retry.exclude_after_blames)"
        )
    return usable[:count]


def spares(count: int, slots: int, taken: Iterable[str], exclude: Iterable[str] = ()) -> list[str]:
    """Up to `count` hot spares (`resources.spare_nodes`): the next free slots after the attempt's
    own (`taken`) and the excluded ones. Fewer when the pool runs out: a spare is a bonus, never a
    reason to fail the launch."""
    skip = set(taken) | set(exclude)
    return [h for h in slot_names(slots) if h not in skip][:count]


def swap(hosts: list[str], replaced: Mapping[str, str]) -> list[str]:
    """The attempt's hosts with each replaced node's rank slot given to its spare."""
    return [replaced.get(h, h) for h in hosts]
