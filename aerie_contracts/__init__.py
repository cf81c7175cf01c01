"""The single definition of every contract that crosses a process boundary in Aerie.

A job crosses five boundaries that no import shows: the environment a node is started with,
JSON files in its contract directory, HTTP between agents/handlers and the control plane, S3
objects (checkpoints and their manifests), and the event outbox (EventBridge-shaped events).
The names and values on those boundaries are defined here, once, and imported everywhere:

- `states`: job, attempt, node and checkpoint states;
- `checkpoints`: the checkpoint layout in S3 (step and attempt-epoch directories, manifest, BAD marker);
- `events`: event source, detail-types and the shape of each detail;
- `failures`: failure kinds, with their retry and blame policy in one table, and the typed reason;
- `health`: the `health` settings of a job spec, one class for the spec and the agent;
- `preflight`: the pre-flight checks' names, result shape, decision and injectable faults;
- `goodput`: the goodput ledger's categories and JSON shape;
- `env`: the `AERIE_*` environment: each name, its meaning, who sets it and who reads it;
- `container`: the SageMaker training-container contract, a node's `/opt/ml` layout and its config files.

Standard library only (it ships in the Lambda bundle and is imported by the torch-free agent).
"""

from aerie_contracts import checkpoints, env, events, failures, goodput, health, preflight, states
from aerie_contracts.events import DetailType
from aerie_contracts.failures import Blame, BlameRule, FailureKind, FailureReason, NodeBlame, Policy, policy
from aerie_contracts.health import HealthSettings
from aerie_contracts.states import AttemptState, CheckpointState, JobState, NodeState

__all__ = [
    "AttemptState",
    "Blame",
    "BlameRule",
    "CheckpointState",
    "DetailType",
    "FailureKind",
    "FailureReason",
    "HealthSettings",
    "JobState",
    "NodeBlame",
    "NodeState",
    "Policy",
    "checkpoints",
    "env",
    "events",
    "failures",
    "goodput",
    "health",
    "policy",
    "preflight",
    "states",
]
