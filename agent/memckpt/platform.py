"""The memory tier's per-node settings on a platform that gives every node the same environment.

The local backend hands each node its own area and the ring's endpoints; Slurm's nodes derive them
from the allocation (`agent.slurm.memory_env`). SageMaker's `CreateTrainingJob` carries one
`Environment` for all instances, so the control plane puts there only what is the same on each (the
interval and the attempt's key: orchestrator/backends/nodeenv.memory_attempt_env) and each node
derives the rest from what SageMaker gives it: `resourceconfig.json`'s hosts (every instance, hot
spares too) and the training job's name (`TRAINING_JOB_NAME`, set by SageMaker in the container).
One port per host, derived from the name: an in-place attempt serves in the same training job on
the same ports, a relaunch (a new training job) on new ones; and instances that share one address
(the local stand-in) never collide.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Mapping

from aerie_contracts import env as E
from aerie_contracts import memckpt

TRAINING_JOB_NAME = "TRAINING_JOB_NAME"  # SageMaker's own variable in the container
# Below Linux's ephemeral range (32768-60999) and the rendezvous' default port (29500) moved up by
# in-place restarts: 20000-28999.
PORT_LOW, PORT_SPAN = 20000, 9000


def port_of(job_name: str, index: int) -> int:
    """The replication endpoint's port of the training job's `index`-th host (sorted)."""
    return PORT_LOW + (zlib.crc32(job_name.encode()) + index) % PORT_SPAN


def sagemaker_env(environ: Mapping[str, str], *, host: str, everyone: Iterable[str]) -> dict[str, str]:
    """This node's area and the ring's endpoints (`AERIE_MEMORY_CHECKPOINT_DIR`, `..._PEERS`), when
    the control plane turned the tier on (interval and key set) and left them to the node; {} else."""
    every = environ.get(E.MEMORY_CHECKPOINT_EVERY, "")
    if every in ("", "0") or not environ.get(E.MEMORY_CHECKPOINT_KEY) or environ.get(E.MEMORY_CHECKPOINT_PEERS):
        return {}
    name = environ.get(TRAINING_JOB_NAME, "")
    if not name:
        return {}
    hosts = sorted(set(everyone) | {host})
    return {
        E.MEMORY_CHECKPOINT_DIR: str(memckpt.root_dir(memckpt.DEFAULT_ROOT) / memckpt.safe_name(host, "host")),
        E.MEMORY_CHECKPOINT_PEERS: ",".join(f"{h}={h}:{port_of(name, i)}" for i, h in enumerate(hosts)),
    }
