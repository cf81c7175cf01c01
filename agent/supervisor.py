"""Run the node's ranks, watch them, and end them fast when something is silently wrong.

One supervisor per node. It starts the entrypoint (through torchrun when the job has more than
one rank), ticks the monitor every `sample_s`, sends heartbeats every `heartbeat_s`, and on a
verdict posts it and stops the ranks' process tree (SIGTERM, grace, SIGKILL), so the attempt
fails in seconds with a named cause instead of waiting out a collective timeout. With
`health.preflight` on, every worker group first passes the node's pre-flight checks and waits for
its peers' (agent/preflight/): a node that fails starts no rank. The agent is a
child subreaper, so no rank of the tree outlives the node (see `agent.proctree.become_subreaper`).

Where the backend keeps agents up between attempts (`AERIE_IN_PLACE_WAIT_S`), a failed worker
group does not end the agent: it stops its ranks once the control plane says the attempt is over
(the heartbeat's answer), asks what comes next (`GET .../next`), and for an in-place successor
restarts only its worker group with the new attempt's id, token and resume point (a warm attempt).
A hot spare (`AERIE_SPARE`, `resources.spare_nodes`) starts no worker group at all: it takes its
inputs, starts its memory tier, runs the node-local part of pre-flight, and then asks the control
plane until an in-place attempt gives it a failed node's rank slot (the answer's host list), or
the job ends.

The node's life is one sequence over one set of facts (agent/node_state.py); each phase of it is
a module of its own, composed here:

- agent/lifecycle.py: `run`, one worker group after another, the watch loop, stopping the ranks;
- agent/in_place.py: the hand-over to an in-place successor (warm ranks, `GET .../next`, switch);
- agent/spare.py: a hot spare's wait for a failed node's slot;
- agent/inputs.py: channels, pre-flight and the resume checkpoint, before any rank starts;
- agent/memory_tier.py: the node's part of the in-memory checkpoint tier;
- agent/node_progress.py: checkpoints, batched metrics and the heartbeat's summary;
- agent/outcome.py: the model upload and the node's exit code and reason.

The health settings come typed (`AgentConfig.health`, parsed once from `AERIE_HEALTH`); no phase
re-reads the environment for them.
"""

from __future__ import annotations

from agent.in_place import InPlaceHandover
from agent.inputs import NodeInputs
from agent.lifecycle import STALL_ASK_S, WATCH_S, NodeLifecycle
from agent.memory_tier import JOB_END_WAIT_S, MemoryTierPhase
from agent.node_progress import METRIC_KEYS, METRICS_BATCH, METRICS_EVERY_S, SNAPSHOTS_KEPT, ProgressForwarding
from agent.node_state import TERM_GRACE_S, VERDICT_GRACE_S
from agent.outcome import NodeOutcome
from agent.spare import HotSpare

__all__ = [
    "JOB_END_WAIT_S",
    "METRICS_BATCH",
    "METRICS_EVERY_S",
    "METRIC_KEYS",
    "SNAPSHOTS_KEPT",
    "STALL_ASK_S",
    "TERM_GRACE_S",
    "VERDICT_GRACE_S",
    "WATCH_S",
    "Supervisor",
]


class Supervisor(
    NodeLifecycle, InPlaceHandover, HotSpare, NodeInputs, MemoryTierPhase, ProgressForwarding, NodeOutcome
):
    """One node's agent: `Supervisor(cfg).run()` is the node's exit code."""
