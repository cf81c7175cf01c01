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

    def prune(self, keep_step: int, replica_of: str | None = None) -> list[Path]:
        """Drop every snapshot older than `keep_step` (complete or torn), and stale partials."""
        removed = []
        for _rank, step, path in self._files(replica_of):
            if step < keep_step:
                path.unlink(missing_ok=True)
                removed.append(path)
        folder = self.dir(replica_of)
        if folder.is_dir():
            for partial in folder.glob("*" + memckpt.PARTIAL):
                parsed = memckpt.parse_name(partial.name.removesuffix(memckpt.PARTIAL))
                if parsed is not None and parsed[1] < keep_step:
                    partial.unlink(missing_ok=True)
                    removed.append(partial)
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
