"""Accelerator utilisation: NVML on GPU nodes, the ranks' own CPU use everywhere else.

Both probes give the same sample shape per accelerator, ``{"index", "util", "mem_used", ...}``
with ``util`` in %, so the detectors neither know nor care which one ran. On a machine without
GPUs the "accelerator" of rank R is rank R's process: a rank that computes burns a core, a rank
that waits in a collective or is stopped does not, which is exactly the signal the GPU gives.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

import psutil

from aerie_contracts.states import ProcessState
from agent import devices
from agent.ring import Ring

_PID_FILE = re.compile(r"rank-(\d+)\.pid$")


class RankProcesses:
    """The real rank processes, from ``node_dir/ranks/rank-<R>.pid``, and their CPU use."""

    def __init__(self, ranks_dir: Path):
        self.ranks_dir = Path(ranks_dir)
        self._procs: dict[int, psutil.Process] = {}
        self._prev: dict[int, tuple[float, float]] = {}  # rank -> (t, cpu seconds)

    def pids(self) -> dict[int, int]:
        out = {}
        try:
            names = os.listdir(self.ranks_dir)
        except FileNotFoundError:
            return out
        for name in names:
            m = _PID_FILE.match(name)
            if not m:
                continue
            try:
                out[int(m.group(1))] = int((self.ranks_dir / name).read_text().strip())
            except (OSError, ValueError):
                continue  # being written
        return out

    def sample(self, now: float) -> list[dict]:
        """``[{"rank", "pid", "state", "cpu", "rss"}]``; ``cpu`` is % of one core since the last call."""
        out = []
        for rank, pid in sorted(self.pids().items()):
            proc = self._procs.get(rank)
            if proc is None or proc.pid != pid:
                try:
                    proc = self._procs[rank] = psutil.Process(pid)
                except psutil.Error:
                    self._procs.pop(rank, None)
                    out.append({"rank": rank, "pid": pid, "state": ProcessState.GONE, "cpu": 0.0, "rss": None})
                    continue
                self._prev.pop(rank, None)
            try:
                with proc.oneshot():
                    times = proc.cpu_times()
                    state = proc.status()
                    rss = proc.memory_info().rss
            except psutil.Error:
                out.append({"rank": rank, "pid": pid, "state": ProcessState.GONE, "cpu": 0.0, "rss": None})
                continue
            cpu_s = times.user + times.system
            prev = self._prev.get(rank)
            self._prev[rank] = (now, cpu_s)
            cpu = None if prev is None or now <= prev[0] else max(0.0, 100.0 * (cpu_s - prev[1]) / (now - prev[0]))
            out.append({"rank": rank, "pid": pid, "state": state, "cpu": cpu, "rss": rss})
        return out


class CpuAcceleratorProbe:
    """Accelerator ``index`` = rank; ``util`` = that rank's CPU % of one core (capped at 100)."""

    kind = "cpu"

    def __init__(self, processes: RankProcesses, maxlen: int = 600):
        self.processes = processes
        self.rings: dict[int, Ring] = {}
        self.maxlen = maxlen

    def sample(self, now: float, procs: list[dict]) -> list[dict]:
        out = []
        for p in procs:
            if p["cpu"] is None:
                continue  # first sight of this process: no interval yet
            s = {"index": p["rank"], "util": min(100.0, p["cpu"]), "mem_used": p.get("rss"), "pid": p["pid"]}
            self.rings.setdefault(p["rank"], Ring(self.maxlen)).append(now, s)
            out.append(s)
        return out


class NvmlProbe:
    """Per GPU: utilisation %, memory used, power (W), temperature (C), ECC and XID error counts.

    Only the GPUs the ranks own are sampled (`watch="owned"`, the default): the devices whose NVML
    compute-process list holds a rank's pid (or a descendant's), and until any does (ranks not yet
    on a GPU, or pids hidden by a container's pid namespace), the devices `CUDA_VISIBLE_DEVICES` /
    `NVIDIA_VISIBLE_DEVICES` name (`agent.devices`). A GPU no rank uses is not idle, it is not
    ours: watching it raised false `silent.gpu_idle` on nodes with fewer ranks than GPUs.
    `watch="all"` (the spec's `health.gpus: all`) samples every GPU on the host.
    """

    kind = "nvml"

    def __init__(self, maxlen: int = 600, watch: str = "owned", env: Mapping[str, str] | None = None):
        import pynvml  # nvidia-ml-py; raises NVMLError when there is no driver

        self.nvml = pynvml
        pynvml.nvmlInit()
        self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        if not self.handles:
            raise RuntimeError("NVML sees no GPU")
        self.watch = watch
        self.mig_handles = {i: self._mig_handles(h) for i, h in enumerate(self.handles)}
        described = [
            (i, self._uuid(h), tuple(u for u in map(self._uuid, self.mig_handles[i]) if u))
            for i, h in enumerate(self.handles)
        ]
        self.visible = devices.visible(env)
        self.visible_indices = sorted(self.visible.pick(described))
        self.watched: list[int] = list(range(len(self.handles)))
        self.rings: dict[int, Ring] = {i: Ring(maxlen) for i in range(len(self.handles))}
        self.xids: dict[int, int] = {i: 0 for i in range(len(self.handles))}
        self.last_xid: dict[int, int] = {}
        self._events = None
        try:
            self._events = pynvml.nvmlEventSetCreate()
            for h in self.handles:
                try:
                    pynvml.nvmlDeviceRegisterEvents(h, pynvml.nvmlEventTypeXidCriticalError, self._events)
                except pynvml.NVMLError:
                    pass  # not supported on this GPU / without privileges
        except pynvml.NVMLError:
            self._events = None

    # --- which GPUs --------------------------------------------------------------------------

    def _uuid(self, handle) -> str | None:
        uuid = self._call(self.nvml.nvmlDeviceGetUUID, handle)
        return uuid.decode() if isinstance(uuid, bytes) else uuid

    def _mig_handles(self, handle) -> list:
        count = self._call(self.nvml.nvmlDeviceGetMaxMigDeviceCount, handle) or 0
        out = []
        for k in range(count):
            mig = self._call(self.nvml.nvmlDeviceGetMigDeviceHandleByIndex, handle, k)
            if mig is not None:  # NVML_ERROR_NOT_FOUND: no MIG device in that slot
                out.append(mig)
        return out

    def _compute_pids(self, index: int) -> set[int]:
        """Pids holding a compute context on GPU `index` (or on one of its MIG devices)."""
        pids: set[int] = set()
        for h in (self.handles[index], *self.mig_handles[index]):
            for proc in self._call(self.nvml.nvmlDeviceGetComputeRunningProcesses, h) or []:
                pids.add(int(proc.pid))
        return pids

    def owned(self, procs: list[dict] | None) -> list[int]:
        """The GPU indices to watch this tick (see the class docstring)."""
        if self.watch == "all":
            return list(range(len(self.handles)))
        ranks = {int(p["pid"]) for p in procs or [] if p.get("pid") and p.get("state") != ProcessState.GONE}
        if ranks:
            on_gpu = {i: self._compute_pids(i) for i in range(len(self.handles))}
            used = [i for i, pids in on_gpu.items() if pids & ranks]
            if not used:  # the CUDA context may belong to a child of the recorded rank process
                family = ranks | _descendants(ranks)
                used = [i for i, pids in on_gpu.items() if pids & family]
            if used:
                return used
        return list(self.visible_indices)

    # --- sampling ----------------------------------------------------------------------------

    def _drain_xids(self) -> None:
        if self._events is None:
            return
        nv = self.nvml
        for _ in range(64):
            try:
                ev = nv.nvmlEventSetWait_v2(self._events, 0)
            except nv.NVMLError:
                return  # timeout: nothing pending
            for i, h in enumerate(self.handles):
                if nv.nvmlDeviceGetIndex(ev.device) == nv.nvmlDeviceGetIndex(h):
                    self.xids[i] += 1
                    self.last_xid[i] = int(ev.eventData)

    def _call(self, fn, *args):
        try:
            return fn(*args)
        except self.nvml.NVMLError:
            return None

    def sample(self, now: float, procs: list[dict] | None = None) -> list[dict]:
        nv = self.nvml
        self._drain_xids()
        self.watched = self.owned(procs)
        out = []
        for i in self.watched:
            h = self.handles[i]
            util = self._call(nv.nvmlDeviceGetUtilizationRates, h)
            mem = self._call(nv.nvmlDeviceGetMemoryInfo, h)
            power = self._call(nv.nvmlDeviceGetPowerUsage, h)
            ecc = self._call(
                nv.nvmlDeviceGetTotalEccErrors, h, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC
            )
            s = {
                "index": i,
                "util": float(util.gpu) if util is not None else None,
                "mem_used": int(mem.used) if mem is not None else None,
                "power_w": power / 1000.0 if power is not None else None,
                "temp_c": self._call(nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU),
                "ecc_uncorrected": ecc,
                "xid_count": self.xids[i],
                "last_xid": self.last_xid.get(i),
            }
            self.rings[i].append(now, s)
            out.append(s)
        return out


def _descendants(pids: set[int]) -> set[int]:
    """Every descendant of `pids`, from one pass over the process table."""
    children: dict[int, list[int]] = {}
    for proc in psutil.process_iter(["ppid"]):
        children.setdefault(proc.info["ppid"], []).append(proc.pid)
    out: set[int] = set()
    stack = list(pids)
    while stack:
        for child in children.get(stack.pop(), []):
            if child not in out:
                out.add(child)
                stack.append(child)
    return out


def make_accelerator_probe(
    processes: RankProcesses, maxlen: int = 600, watch: str = "owned", env: Mapping[str, str] | None = None
):
    """NVML when a driver and a GPU answer, else the CPU stand-in."""
    try:
        return NvmlProbe(maxlen, watch=watch, env=env)
    except Exception:  # ImportError, NVMLError_LibraryNotFound, no GPU, ...
        return CpuAcceleratorProbe(processes, maxlen)
