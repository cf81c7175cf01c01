"""Lifecycle states of jobs, attempts, nodes, checkpoints and outbox events, and of a rank's
process as the agent sees it (stored and sent as their string values).

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


class OutboxStatus(StrEnum):
    """Where an outbox event (the `events` row written with its state change) is in delivery."""

    PENDING = "pending"  # written, not yet delivered to every subscriber (retried until it is)
    DELIVERED = "delivered"  # every subscriber (and the publisher) took it
    DEAD = "dead"  # a permanent error, or out of deliveries: dead-lettered, never retried


class ProcessState(StrEnum):
    """A rank's process as the agent's probe records it: psutil's `Process.status()` words as
    they are, plus `gone` where the process no longer exists (or could not be read)."""

    RUNNING = "running"
    SLEEPING = "sleeping"
    DISK_SLEEP = "disk-sleep"
    STOPPED = "stopped"  # SIGSTOP: alive, never progressing
    TRACING_STOP = "tracing-stop"
    ZOMBIE = "zombie"
    DEAD = "dead"
    WAKING = "waking"
    IDLE = "idle"
    LOCKED = "locked"
    WAITING = "waiting"
    PARKED = "parked"
    GONE = "gone"  # Aerie's own: no such process any more


# A rank that cannot make progress (the `silent.hang` detector and blame's `stopped_rank` rule).
STOPPED_PROCESS_STATES = frozenset({ProcessState.STOPPED, ProcessState.ZOMBIE, ProcessState.DEAD, ProcessState.GONE})
