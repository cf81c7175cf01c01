"""One node's part in the ring: replicate its ranks' newest common snapshot to its peer, and say
when a memory checkpoint is good on this node (both copies complete for every local rank).

The agent's tier (node.NodeMemoryTier) calls `tick` on a timer, in a thread of its own; `key` is
the attempt's replication key (agent/memckpt/auth.py).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from aerie_contracts.checkpoints import CheckpointTier, memory_uri
from agent.memckpt.replicate import ReplicationError, send_snapshot
from agent.memckpt.store import SnapshotStore

log = logging.getLogger("aerie.agent.memckpt")


@dataclass
class Replicated:
    step: int
    ranks: list[int]
    size_bytes: int


class Replicator:
    def __init__(
        self,
        store: SnapshotStore,
        *,
        node: str,
        ranks: list[int],
        peer: tuple[str, int] | None,
        peer_node: str | None = None,
        key: bytes,
    ) -> None:
        if not ranks:
            raise ValueError("a node with no ranks has nothing to replicate")
        self.store, self.node, self.ranks = store, node, sorted(ranks)
        self.peer, self.peer_node, self.key = peer, peer_node, key
        self.replicated: int | None = None
        # The job's newest good memory checkpoint, as the control plane last said (the heartbeat's
        # answer); None: none known. Never pruned, here or in the replicas this node holds.
        self.good: int | None = None

    def retain(self) -> None:
        """Prune this node's snapshots and the replicas it holds (store.retain_all): only below
        min(the step replicated, the good step), and within memckpt.MAX_HELD per rank and copy."""
        self.store.retain_all(good=self.good, replicated=self.replicated)

    def tick(self) -> Replicated | None:
        """Replicate the newest step all local ranks have, if newer than the last one; returns it
        once the peer holds every rank's copy complete. Prunes (`retain`) as it goes: a step
        replicated here is not yet good job-wide (another node may never finish it)."""
        self.retain()  # a listing of a few files: the good step may have moved, a rank written more
        step = self.store.newest_common_step(self.ranks)
        if step is None or (self.replicated is not None and step <= self.replicated):
            return None
        if self.peer is None:
            log.info("no peer node (a one-node attempt): memory checkpoints have one copy only, never good")
            return None
        size = 0
        for rank in self.ranks:
            path = self.store.find(rank, step)
            if path is None:
                return None  # pruned meanwhile by the rank: a newer step is coming
            try:
                size += send_snapshot(self.peer, path, job=self.store.job, node=self.node, key=self.key).size
            except (ReplicationError, OSError, ValueError) as exc:
                log.warning("replicating rank %d step %d to %s failed: %s", rank, step, self.peer, exc)
                return None
        self.replicated = step
        self.retain()  # older snapshots go now, unless the job's newest good one is among them
        return Replicated(step=step, ranks=list(self.ranks), size_bytes=size)


def report_body(
    done: Replicated, *, job: str, attempt: int, node: str, world_size: int, peer_node: str | None
) -> dict[str, Any]:
    """The agent's `/checkpoints` report of a memory checkpoint on this node (the control plane
    records it good once the reports cover every rank of the world)."""
    tier = str(CheckpointTier.MEMORY)
    return {
        "step": done.step,
        "uri": memory_uri(job, done.step, attempt),
        "tier": tier,
        "meta": {
            "tier": tier,
            "node": node,
            "replica_node": peer_node,
            "ranks": done.ranks,
            "world_size": world_size,
            "size_bytes": done.size_bytes,
        },
    }
