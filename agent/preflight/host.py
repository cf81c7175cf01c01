"""Host memory and the shared memory the memory checkpoint tier writes to (agent/memckpt)."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Mapping
from pathlib import Path

import psutil

from aerie_contracts import env as E
from aerie_contracts.health import PreflightSettings
from aerie_contracts.memckpt import DEFAULT_ROOT
from aerie_contracts.preflight import Check, CheckResult, Fault
from agent.preflight.checks import at_least

MiB = 1024 * 1024


def host_memory(settings: PreflightSettings) -> CheckResult:
    t0 = time.perf_counter()
    vm = psutil.virtual_memory()
    return at_least(
        Check.HOST_MEMORY,
        vm.available / MiB,
        settings.min_host_mem_mb,
        "MiB",
        time.perf_counter() - t0,
        "available",
        total_mb=round(vm.total / MiB),
    )


def shm(settings: PreflightSettings, env: Mapping[str, str], procs: int, faults: list[Fault]) -> CheckResult:
    """Free space where snapshots go, against `min_shm_free_mb` or, when the memory tier is on and
    this node already holds snapshots (an earlier attempt's), what the tier keeps of them: its
    ranks' newest snapshot times `shm_snapshot_factor` (two own, two of the peer's)."""
    t0 = time.perf_counter()
    area = Path(env.get(E.MEMORY_CHECKPOINT_DIR) or DEFAULT_ROOT)
    probe = _existing(area)
    free = 0.0 if Fault.SHM_FULL in faults else shutil.disk_usage(probe).free / MiB
    newest = _newest_snapshot_mb(area)
    tier_on = (env.get(E.MEMORY_CHECKPOINT_EVERY) or "0").strip() not in ("", "0")
    need = settings.min_shm_free_mb
    if tier_on and newest:
        need = max(need, settings.shm_snapshot_factor * newest * max(1, procs))
    check = at_least(
        Check.SHM,
        free,
        need,
        "MiB",
        time.perf_counter() - t0,
        f"free in {probe}",
        area=str(area),
        memory_tier=tier_on,
        newest_snapshot_mb=round(newest, 2),
    )
    if Fault.SHM_FULL in faults:
        check["reason"] += " (injected: shm_full)"
    return check


def _existing(path: Path) -> Path:
    """The path itself or its nearest existing parent (the area is made on first use)."""
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _newest_snapshot_mb(area: Path) -> float:
    """The largest snapshot of the newest save under the area (files within a minute of the newest
    one), in MiB; 0 when there are none."""
    found: list[tuple[float, int]] = []
    if area.is_dir():
        for root, _dirs, files in os.walk(area):
            for name in files:
                if name.endswith(".snap"):
                    try:
                        st = os.stat(os.path.join(root, name))
                    except OSError:
                        continue  # pruned while we looked
                    found.append((st.st_mtime, st.st_size))
    if not found:
        return 0.0
    newest = max(t for t, _ in found)
    return max(size for t, size in found if t >= newest - 60) / MiB
