"""Who owns a job's shared-memory area, so that no failed job's snapshots stay in /dev/shm.

The agent that serves a job's area on a node writes `owner.json` in it (its pid, that process's
start time, job, host) and refreshes the file's mtime every `REFRESH_S` while it lives. At the
end of the job the agent removes the area itself (node.NodeMemoryTier.close); what an agent can't
remove (it was killed, or it never learnt that the job ended) is swept by the next agent that
starts on the node's area root, and on the local backend by each launch (every node of one host):
an area of another job whose owner process is gone and whose lease is older than `STALE_S`
(`STALE_S` leaves a relaunch of that job, whose agents are stopped and started again, time to
take its area back), or an area without a lease whose newest change is that old.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any

from aerie_contracts import memckpt

log = logging.getLogger("aerie.agent.memckpt")

LEASE = "owner.json"
REFRESH_S = 10.0
STALE_S = 120.0


def _process_start(pid: int) -> float | None:
    """When process `pid` started (Linux: clock ticks since boot, /proc/<pid>/stat field 22), None
    if there is no such process. Standard library only: the local backend sweeps too."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return None
    except OSError:
        stat = ""
    if stat:
        # The command name (field 2) is in parentheses and may hold spaces: count after its end.
        return float(stat[stat.rindex(")") + 2 :].split()[19])
    try:
        os.kill(pid, 0)  # no /proc: whether it exists at all is all there is to know
    except ProcessLookupError:
        return None
    except PermissionError:
        pass
    return 0.0


def write(area: Path, *, job: str, host: str) -> Path:
    """Claim `area` for this process (atomically replacing an earlier owner's claim)."""
    area.mkdir(parents=True, exist_ok=True)
    path = area / LEASE
    info = {"pid": os.getpid(), "start": _process_start(os.getpid()), "job": job, "host": host}
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(info))
    os.replace(tmp, path)
    return path


def owner_alive(info: dict[str, Any]) -> bool:
    """Whether the process a lease names still runs (the same process: its start time matches, so
    a reused pid is not taken for it)."""
    pid, start = info.get("pid"), info.get("start")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    actual = _process_start(pid)
    return actual is not None and isinstance(start, (int, float)) and actual == start


def _newest_change(area: Path) -> float:
    """The latest mtime of the area and the folders snapshots are written into."""
    folders = [area, area / memckpt.LOCAL, area / memckpt.REPLICA]
    replicas = area / memckpt.REPLICA
    if replicas.is_dir():
        folders += [p for p in replicas.iterdir() if p.is_dir()]
    times = []
    for folder in folders:
        try:
            times.append(folder.stat().st_mtime)
        except OSError:
            continue
    return max(times, default=0.0)


def stale_reason(area: Path, *, now: float | None = None, stale_s: float | None = None) -> str | None:
    """Why `area` may be removed, or None while it may still be used."""
    now = time.time() if now is None else now
    stale_s = STALE_S if stale_s is None else stale_s
    path = area / LEASE
    try:
        info = json.loads(path.read_text())
        leased_at = path.stat().st_mtime
    except FileNotFoundError:
        info, leased_at = None, None
    except (OSError, ValueError):
        info, leased_at = {}, 0.0  # unreadable: as good as no owner
    if info is None:
        idle = now - _newest_change(area)
        return f"no owner, untouched for {idle:.0f}s" if idle > stale_s else None
    if isinstance(info, dict) and owner_alive(info):
        return None
    idle = now - (leased_at or 0.0)
    if idle <= stale_s:
        return None
    return f"owner (pid {info.get('pid') if isinstance(info, dict) else '?'}) gone, lease {idle:.0f}s old"


def sweep(root: str | os.PathLike[str], *, keep: str | None = None, stale_s: float | None = None) -> list[Path]:
    """Remove the areas under `root` (one folder per job) that nobody will use again; `keep` (the
    sweeping agent's own job) is never removed. Returns what was removed."""
    base = Path(root)
    removed: list[Path] = []
    if not base.is_dir():
        return removed
    for area in sorted(base.iterdir()):
        if area.name == keep or not area.is_dir() or area.is_symlink():
            continue
        try:
            memckpt.safe_name(area.name, "job")
        except ValueError:
            continue  # not an area this code made
        if not any((area / name).exists() for name in (LEASE, memckpt.LOCAL, memckpt.REPLICA)):
            continue  # nor is this (a root set to a shared folder must not cost its neighbours)
        why = stale_reason(area, stale_s=stale_s)
        if why is not None:
            shutil.rmtree(area, ignore_errors=True)
            removed.append(area)
            log.info("removed the memory checkpoint area of job %s under %s: %s", area.name, base, why)
    return removed


def sweep_nodes(base: str | os.PathLike[str], *, keep: str | None = None, stale_s: float | None = None) -> list[Path]:
    """`sweep` in every node's folder under `base` (the local backend: one folder per node, all
    on this host), then the node folders left empty."""
    folder = Path(base)
    removed: list[Path] = []
    if not folder.is_dir():
        return removed
    for node in sorted(folder.iterdir()):
        if node.is_dir() and not node.is_symlink():
            removed += sweep(node, keep=keep, stale_s=stale_s)
            try:
                node.rmdir()  # only if empty
            except OSError:
                pass
    return removed


class Lease:
    """This agent's claim on its job's area, refreshed in a thread of its own until `stop`."""

    def __init__(self, area: Path, *, job: str, host: str, refresh_s: float = REFRESH_S) -> None:
        self.area, self.job, self.host, self.refresh_s = area, job, host, refresh_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> Lease:
        write(self.area, job=self.job, host=self.host)
        self._thread = threading.Thread(target=self._refresh, name="memckpt-lease", daemon=True)
        self._thread.start()
        return self

    def _refresh(self) -> None:
        while not self._stop.wait(self.refresh_s):
            try:
                os.utime(self.area / LEASE)
            except FileNotFoundError:
                try:
                    write(self.area, job=self.job, host=self.host)  # the area was removed under it
                except OSError:
                    pass
            except OSError:
                pass

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
