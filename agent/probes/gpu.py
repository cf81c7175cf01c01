"""Accelerator utilisation: NVML on GPU nodes, the ranks' own CPU use everywhere else.

Both probes give the same sample shape per accelerator, ``{"index", "util", "mem_used", ...}``
with ``util`` in %, so the detectors neither know nor care which one ran. On a machine without
GPUs the "accelerator" of rank R is rank R's process: a rank that computes burns a core, a rank
that waits in a collective or is stopped does not, which is exactly the signal the GPU gives.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

import psutil

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
                    out.append({"rank": rank, "pid": pid, "state": "gone", "cpu": 0.0, "rss": None})
                    continue
                self._prev.pop(rank, None)
            try:
                with proc.oneshot():
                    times = proc.cpu_times()
                    state = proc.status()
                    rss = proc.memory_info().rss
            except psutil.Error:
                out.append({"rank": rank, "pid": pid, "state": "gone", "cpu": 0.0, "rss": None})
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
    """Per GPU: utilisation %, memory used, power (W), temperature (C), ECC and XID error counts."""

    kind = "nvml"

    def __init__(self, maxlen: int = 600):
        import pynvml  # nvidia-ml-py; raises NVMLError when there is no driver

        self.nvml = pynvml
        pynvml.nvmlInit()
        self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        if not self.handles:
            raise RuntimeError("NVML sees no GPU")
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
        out = []
        for i, h in enumerate(self.handles):
            util = self._call(nv.nvmlDeviceGetUtilizationRates, h)
            mem = self._call(nv.nvmlDeviceGetMemoryInfo, h)
            power = self._call(nv.nvmlDeviceGetPowerUsage, h)
            ecc = self._call(nv.nvmlDeviceGetTotalEccErrors, h, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                             nv.NVML_VOLATILE_ECC)
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


def make_accelerator_probe(processes: RankProcesses, maxlen: int = 600):
    """NVML when a driver and a GPU answer, else the CPU stand-in."""
    try:
        return NvmlProbe(maxlen)
    except Exception:  # ImportError, NVMLError_LibraryNotFound, no GPU, ...
        return CpuAcceleratorProbe(processes, maxlen)
