"""How a failed attempt's successor starts: on the same nodes (a warm attempt) or launched anew.

The words of the decision, shared by everyone who reads it: the recovery package (`recovery/`)
decides and records the mode, with its reason, in the new attempt's `cause` (shown by the API and
`aerie describe`); the controller and the backend act on it, and a node agent waiting between
attempts asks the control plane what comes next (`NextAction`). The decisions themselves are
`recovery.modes`'s. Standard library only (it ships in the Lambda bundle and the torch-free agent).
"""

from __future__ import annotations

from typing import Any

from aerie_contracts._strenum import StrEnum
from aerie_contracts.backends import backends_with
from aerie_contracts.failures import FailureKind


class RestartMode(StrEnum):
    # The same node allocation: the agents stay up and restart only their worker group.
    IN_PLACE = "in_place"
    # The backend ends the attempt's nodes and launches the next attempt from nothing.
    RELAUNCH = "relaunch"


class NextAction(StrEnum):
    """The answer to an agent whose worker group ended (`GET .../nodes/{host}/next`)."""

    WAIT = "wait"  # no decision yet: ask again
    RESTART = "restart"  # an in-place successor: restart the worker group for it
    EXIT = "exit"  # nothing for this node (a relaunch, the job is over): end the agent


# In `GET .../next`'s `why` for `exit`: the in-place successor goes on without the asking node (a
# hot spare took its slot). Its agent then exits 0: the job goes on, and a backend that ends its
# job when one node's program fails (SageMaker, Slurm's `srun --kill-on-bad-exit`) must not.
LEFT_OUT = "does not run on"

# Keys of an attempt's `cause` that carry the decision.
CAUSE_MODE = "mode"
CAUSE_MODE_REASON = "mode_reason"
# With a memory resume point: the durable checkpoint the ranks use instead if any of them cannot
# restore its snapshot (the ranks agree on it collectively: trainer/resume.py).
CAUSE_RESUME_FALLBACK = "resume_fallback"
# ... and which node wrote each rank's snapshot and which holds its replica ({node: {ranks, replica_node}}).
CAUSE_MEMORY_NODES = "memory_nodes"

# ... and, when hot spares take failed nodes' places (resources.spare_nodes): {failed host: spare host}.
CAUSE_REPLACED_NODES = "replaced_nodes"

# The backends by capability (declared once, in `aerie_contracts.backends`).
IN_PLACE_BACKENDS = backends_with("in_place")
MEMORY_TIER_BACKENDS = backends_with("memory_tier")
MEMORY_OUTLIVES_RELAUNCH = backends_with("memory_outlives_relaunch")

# Failures after which the attempt's allocation cannot be reused: a node is gone or cut off, failed
# its pre-flight check (bad hardware: it would fail again), or the attempt never had its nodes.
NOT_REUSABLE = frozenset(
    {
        FailureKind.NODE_LOST.value,
        FailureKind.NODE_PREEMPTED.value,
        FailureKind.LAUNCH_FAILED.value,
        FailureKind.PLACEMENT_FAILED.value,
        FailureKind.PREFLIGHT_FAILED.value,
    }
)

# Of those, the failures a hot spare repairs (resources.spare_nodes): one node is gone or unfit, the
# others are fine, so the next attempt runs in place with a spare in the failed node's rank slot.
SPARE_REPAIRS = frozenset(
    {FailureKind.NODE_LOST.value, FailureKind.NODE_PREEMPTED.value, FailureKind.PREFLIGHT_FAILED.value}
)

# `retry.in_place_restarts`: consecutive in-place restarts before a relaunch (0: never in place).
DEFAULT_IN_PLACE_RESTARTS = 2


def mode_of(cause: dict[str, Any] | None) -> RestartMode:
    """An attempt's restart mode from its `cause`; a first attempt, or one recorded before modes
    existed, was launched anew."""
    value = (cause or {}).get(CAUSE_MODE)
    return RestartMode.IN_PLACE if value == RestartMode.IN_PLACE else RestartMode.RELAUNCH
