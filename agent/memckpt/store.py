"""The node's shared-memory area: the newest complete snapshot per rank, local or replica.

Completeness is the header's (written last, see aerie_contracts.memckpt): a file without a
complete header is one being written, or a torn one, and is never picked. The payload's checksum
is verified where bytes leave or are restored (replicate, restore), not on every scan.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from aerie_contracts import memckpt


@dataclass(frozen=True)
class Entry:
    path: Path
    header: memckpt.Header


class SnapshotStore:
    def __init__(self, job: str, root: str | os.PathLike[str] | None = None) -> None:
        self.job = memckpt.safe_name(job, "job")
        self.root = memckpt.root_dir(root)
        self._kept: int | None = None  # the step last written to memckpt.KEEP_FILE

    def dir(self, replica_of: str | None = None) -> Path:
        """This node's own snapshots, or the replicas of node `replica_of`'s."""
        if replica_of is None:
            return memckpt.local_dir(self.root, self.job)
        return memckpt.replica_dir(self.root, self.job, replica_of)

    def _files(self, replica_of: str | None) -> list[tuple[int, int, Path]]:
        """(rank, step, path) of every snapshot-named file, newest step first."""
        folder = self.dir(replica_of)
        if not folder.is_dir():
            return []
        found = [(*parsed, p) for p in folder.iterdir() if (parsed := memckpt.parse_name(p.name)) is not None]
        return sorted(found, key=lambda x: (x[0], -x[1]))

    def complete(self, replica_of: str | None = None) -> dict[int, list[Entry]]:
        """Per rank, its complete snapshots (header checked, job matching), newest first."""
        out: dict[int, list[Entry]] = {}
        for rank, step, path in self._files(replica_of):
            try:
                header = memckpt.read_header(path)
            except (memckpt.SnapshotError, OSError):
                continue  # being written, torn, or removed meanwhile
            if (header.job, header.rank, header.step) == (self.job, rank, step):
                out.setdefault(rank, []).append(Entry(path, header))
        return out

    def newest(self, rank: int, replica_of: str | None = None) -> Entry | None:
        entries = self.complete(replica_of).get(rank)
        return entries[0] if entries else None

    def find(self, rank: int, step: int, replica_of: str | None = None) -> Path | None:
        path = self.dir(replica_of) / memckpt.file_name(step, rank)
        return path if path.exists() else None

    def newest_common_step(self, ranks: list[int], replica_of: str | None = None) -> int | None:
        """The newest step every one of `ranks` has a complete snapshot of (a checkpoint needs all)."""
        complete = self.complete(replica_of)
        steps = [{e.header.step for e in complete.get(rank, [])} for rank in ranks]
        common = set.intersection(*steps) if steps else set()
        return max(common) if common else None

    def replica_nodes(self) -> list[str]:
        """The nodes whose replicas this node holds."""
        folder = memckpt.area_dir(self.root, self.job) / memckpt.REPLICA
        return sorted(p.name for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []

    def retain(
        self, *, good: int | None, floor: int | None, replica_of: str | None = None, rank: int | None = None
    ) -> list[Path]:
        """Per rank (or only `rank`), drop the complete-named snapshots `memckpt.kept_steps` does not
        keep: none below `floor` but the job's newest good step, at most `memckpt.MAX_HELD`, never
        `good`. A replica's floor is its newest received step (`floor=None` there is read so). Files
        being written or received (partials) are left alone; older stale partials go."""
        by_rank: dict[int, dict[int, Path]] = {}
        for r, step, path in self._files(replica_of):
            if rank is None or r == rank:
                by_rank.setdefault(r, {})[step] = path
        removed = []
        for steps in by_rank.values():
            below = floor if floor is not None or replica_of is None else max(steps)
            low = None if good is None or below is None else min(below, good)
            keep = memckpt.kept_steps(steps.keys(), good=good, floor=low)
            for step, path in steps.items():
                if step not in keep:
                    path.unlink(missing_ok=True)
                    removed.append(path)
        folder = self.dir(replica_of)
        oldest = min((min(s) for s in by_rank.values() if s), default=None)
        if oldest is not None and folder.is_dir():
            for partial in folder.glob("*" + memckpt.PARTIAL):
                parsed = memckpt.parse_name(partial.name.removesuffix(memckpt.PARTIAL))
                if parsed is not None and parsed[1] < oldest:
                    partial.unlink(missing_ok=True)
                    removed.append(partial)
        return removed

    def retain_all(self, *, good: int | None, replicated: int | None) -> list[Path]:
        """`retain` over this node's own snapshots (floor: the newest step it replicated) and every
        replica it holds, and record for the ranks the step they must not drop (memckpt.KEEP_FILE)."""
        if good != self._kept:
            memckpt.write_keep(self.dir(), good)
            self._kept = good
        removed = self.retain(good=good, floor=replicated)
        for node in self.replica_nodes():
            removed += self.retain(good=good, floor=None, replica_of=node)
        return removed

    def drop_after(self, step: int | None) -> list[Path]:
        """Drop this node's own snapshots newer than `step` (all of them for None): written by a
        worker group whose timeline the resume abandoned, they must never be replicated as this one's."""
        removed = []
        for _rank, snap_step, path in self._files(None):
            if step is None or snap_step > step:
                path.unlink(missing_ok=True)
                removed.append(path)
        return removed
