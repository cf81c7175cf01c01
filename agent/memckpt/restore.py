"""Where a rank's state comes from when the resume point is a memory checkpoint.

In order, the first that is there *and verifies* (header complete, payload CRC-32): this node's
own copy; the replica held by the ring successor of the node that wrote it (fetched over the
replication protocol into this node's area); the writer's own copy, where the writer is still a
node of the job but no longer runs that rank (a relaunch that left out the *first* node moves every
survivor's ranks down a slot, and the holder of the survivor's replica may be the node left out);
else S3 (the newest good durable checkpoint, which the caller names). A torn snapshot or a corrupt
one (a flipped byte) is skipped with its reason.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from aerie_contracts import memckpt
from agent.memckpt.replicate import ReplicationError, fetch_snapshot
from agent.memckpt.store import SnapshotStore

log = logging.getLogger("aerie.agent.memckpt")

LOCAL, REPLICA, WRITER, S3 = "local", "replica", "writer", "s3"


@dataclass
class Source:
    tier: str  # local | replica | writer | s3
    path: Path | None = None  # the verified snapshot (local, replica and writer)
    uri: str | None = None  # the S3 checkpoint (s3)
    skipped: list[str] = field(default_factory=list)  # why each earlier tier was not used


def resolve(
    store: SnapshotStore,
    *,
    rank: int,
    step: int,
    written_by: str,
    holder: tuple[str, int] | None,
    s3_uri: str | None,
    key: bytes,
    writer: tuple[str, int] | None = None,
) -> Source:
    """The source of `rank`'s state at `step`. `written_by`: the node whose ranks wrote the
    snapshot (the replica is filed under its name); `holder`: the address of that node's ring
    successor; `writer`: the address of `written_by` itself, where it is another node of the job;
    `s3_uri`: the fallback; `key`: the attempt's replication key."""
    skipped: list[str] = []
    local = store.dir() / memckpt.file_name(step, rank)
    try:
        header = memckpt.verify(local)
        if (header.job, header.rank, header.step) == (store.job, rank, step):
            return Source(LOCAL, path=local, skipped=skipped)
        skipped.append(f"local: names {header}")
    except (memckpt.SnapshotError, OSError) as exc:
        skipped.append(f"local: {exc}")
    if holder is not None:
        try:
            local.unlink(missing_ok=True)  # a bad local copy is replaced by the fetched one
            fetch_snapshot(holder, local, job=store.job, node=written_by, rank=rank, step=step, key=key)
            return Source(REPLICA, path=local, skipped=skipped)
        except (memckpt.SnapshotError, ReplicationError, OSError) as exc:
            skipped.append(f"replica at {holder[0]}:{holder[1]}: {exc}")
    else:
        skipped.append("replica: no holder")
    if writer is not None:
        try:
            local.unlink(missing_ok=True)
            fetch_snapshot(writer, local, job=store.job, node=written_by, rank=rank, step=step, key=key, tier=LOCAL)
            return Source(WRITER, path=local, skipped=skipped)
        except (memckpt.SnapshotError, ReplicationError, OSError) as exc:
            skipped.append(f"writer's copy at {writer[0]}:{writer[1]}: {exc}")
    for reason in skipped:
        log.warning("memory checkpoint of rank %d step %d not used: %s", rank, step, reason)
    return Source(S3, uri=s3_uri, skipped=skipped)
