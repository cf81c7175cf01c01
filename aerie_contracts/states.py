"""Lifecycle states of jobs, attempts, nodes and checkpoints (stored as their string values).

Job and attempt state names follow SageMaker's TrainingJobStatus where one exists, so a
SageMaker user reads them without a glossary.
"""

from __future__ import annotations

from aerie_contracts._strenum import StrEnum


class JobState(StrEnum):
    SUBMITTED = "Submitted"
    IN_PROGRESS = "InProgress"
    COMPLETED = "Completed"
    FAILED = "Failed"
    STOPPED = "Stopped"


class AttemptState(StrEnum):
    PENDING = "Pending"  # created (by the controller or chain_restart), not yet handed to a backend
    LAUNCHING = "Launching"  # being handed to a backend (internal: no event)
    STARTING = "Starting"  # a backend's view: nodes not yet all up
    RUNNING = "Running"
    COMPLETED = "Completed"
    FAILED = "Failed"
    STOPPED = "Stopped"


class NodeState(StrEnum):
    STARTING = "Starting"  # launched, no heartbeat yet
    RUNNING = "Running"
    COMPLETED = "Completed"
    FAILED = "Failed"
    STOPPED = "Stopped"


class CheckpointState(StrEnum):
    GOOD = "good"  # manifest committed, every object present with its size, not flagged bad
    BAD = "bad"  # verification or a restore from it failed (a BAD marker object, never a delete)
    INCOMPLETE = "incomplete"  # no manifest: a save in progress, one that died, or a fenced attempt's
    CORRUPT = "corrupt"  # manifest present, objects missing or of the wrong size
    DELETED = "deleted"  # removed by GC


JOB_TERMINAL = frozenset({JobState.COMPLETED, JobState.FAILED, JobState.STOPPED})
ATTEMPT_TERMINAL = frozenset({AttemptState.COMPLETED, AttemptState.FAILED, AttemptState.STOPPED})
ATTEMPT_ACTIVE = frozenset({AttemptState.PENDING, AttemptState.LAUNCHING, AttemptState.RUNNING})
