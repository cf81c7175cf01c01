"""What each backend can do, declared once: the recovery package decides from these flags (it runs
in a Lambda function, far from any backend object), and each backend class carries its own row
(`Backend.capabilities`), checked against the verbs it implements by
`tests/orchestrator/backends/test_capabilities.py`.

A new backend adds one row here; the policy then treats it correctly without a line changed in
`recovery/`, where a backend's name never appears.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Capabilities:
    # The nodes' agents outlive a worker group, so the next attempt may run on the same nodes
    # (`Backend.restart_in_place`). Slurm's stay up inside the job's one allocation (`sbatch`),
    # SageMaker's inside the running training job.
    in_place: bool = False
    # Hot spares (`resources.spare_nodes`) wait beside the attempt and take a failed node's slot.
    hot_spares: bool = False
    # More hot spares can be started beside a running attempt (`Backend.add_spares`: the local
    # backend on its pool's free slots; Slurm not yet, though a spare allocation could); implies
    # `hot_spares`. SageMaker's training job has a fixed instance count: its spares come at launch only.
    add_spares: bool = False
    # The in-memory checkpoint tier: its replication ring needs each node's endpoint (the local
    # backend picks them at launch, Slurm's nodes derive them from the job id, SageMaker's from
    # resourceconfig.json's hosts and the training job's name).
    memory_tier: bool = False
    # A relaunched attempt may still find the nodes' shared memory: the local backend's nodes are
    # folders of one host. Elsewhere a relaunch is a new allocation and resumes from S3.
    memory_outlives_relaunch: bool = False
    # `aerie chaos` faults can be handed to the nodes' agents (`Backend.chaos`).
    chaos: bool = False


CAPABILITIES: dict[str, Capabilities] = {
    "local": Capabilities(
        in_place=True, hot_spares=True, add_spares=True, memory_tier=True, memory_outlives_relaunch=True, chaos=True
    ),
    "slurm": Capabilities(in_place=True, hot_spares=True, memory_tier=True),
    "sagemaker": Capabilities(in_place=True, hot_spares=True, memory_tier=True),
}

NONE = Capabilities()


def capabilities(backend: str) -> Capabilities:
    """The row of `backend`; an unknown backend can do nothing beyond launch, poll and stop."""
    return CAPABILITIES.get(backend, NONE)


def backends_with(flag: str) -> frozenset[str]:
    """The backends that declare `flag` (a field of `Capabilities`)."""
    return frozenset(name for name, caps in CAPABILITIES.items() if getattr(caps, flag))
