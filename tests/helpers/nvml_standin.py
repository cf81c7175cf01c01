"""A stand-in for `pynvml` (nvidia-ml-py) on a machine without an NVIDIA GPU or driver.

It speaks nvidia-ml-py's API, not Aerie's: the same function names and arguments, the same return
shapes (`.gpu`/`.memory` utilisation, `.used`/`.free`/`.total` memory, process objects with `.pid`,
`.usedGpuMemory`, `.gpuInstanceId`, `.computeInstanceId`, UUIDs as `str` as nvidia-ml-py 12+
returns them), and the real library's `NVMLError` with its real error codes, raised where the
driver would (no MIG device in a slot, ECC unsupported, nothing pending on an event set). Only
what Aerie's probes call is modelled; anything else raises AttributeError, so a new call shows up.
"""

from __future__ import annotations

import types
from dataclasses import dataclass, field

import pynvml as real  # the real bindings import fine without a driver: errors and constants


@dataclass
class Gpu:
    uuid: str
    util: float = 0.0
    mem_used: int = 1 << 30
    pids: list[int] = field(default_factory=list)  # processes with a compute context on it
    mig: list[str] = field(default_factory=list)  # MIG device UUIDs ("MIG-…"), MIG mode on if any
    mig_pids: dict[str, list[int]] = field(default_factory=dict)
    ecc_uncorrected: int | None = None  # None: ECC not supported (a consumer card), as before
    retired_pending: bool | None = False  # retired pages waiting for a reset (None: NotSupported, as on H100)
    remap: tuple[int, int, bool, bool] | None = None  # row remapping (A100/H100), None: NotSupported
    throttle_reasons: int = 0  # nvmlClocksThrottleReasons bits
    sm_clock_mhz: int = 1980


class _Handle:
    def __init__(self, gpu: Gpu, index: int, mig: str | None = None):
        self.gpu, self.index, self.mig = gpu, index, mig


def _proc(pid: int) -> types.SimpleNamespace:
    # nvidia-ml-py returns nvmlFriendlyObject(c_nvmlProcessInfo_v3_t): these four fields.
    return types.SimpleNamespace(
        pid=pid, usedGpuMemory=256 << 20, gpuInstanceId=0xFFFFFFFF, computeInstanceId=0xFFFFFFFF
    )


def module(gpus: list[Gpu], xids: list[tuple[int, int]] | None = None) -> types.ModuleType:
    """A `pynvml` module whose driver sees `gpus` (NVML index = position in the list), with the
    critical XID errors `xids` ((GPU index, XID) each) pending on any event set."""
    nv = types.ModuleType("pynvml")
    for name in dir(real):
        if name.startswith(("NVML_", "NVMLError", "nvmlEventType")):
            setattr(nv, name, getattr(real, name))
    handles = [_Handle(g, i) for i, g in enumerate(gpus)]

    def err(code: int) -> real.NVMLError:
        return real.NVMLError(code)

    def by_index(i: int) -> _Handle:
        if not 0 <= i < len(handles):
            raise err(real.NVML_ERROR_INVALID_ARGUMENT)
        return handles[i]

    def util(h: _Handle):
        if h.mig:  # utilisation is not reported per MIG device
            raise err(real.NVML_ERROR_NOT_SUPPORTED)
        return types.SimpleNamespace(gpu=int(h.gpu.util), memory=int(h.gpu.util) // 2)

    def max_mig(h: _Handle) -> int:
        if not h.gpu.mig:
            raise err(real.NVML_ERROR_NOT_SUPPORTED)  # a GPU that is not MIG-capable
        return 7

    def mig_by_index(h: _Handle, k: int) -> _Handle:
        if k >= len(h.gpu.mig):
            raise err(real.NVML_ERROR_NOT_FOUND)
        return _Handle(h.gpu, h.index, h.gpu.mig[k])

    def compute_procs(h: _Handle):
        pids = h.gpu.mig_pids.get(h.mig, []) if h.mig else h.gpu.pids
        return [_proc(p) for p in pids]

    pending = list(xids or [])

    def wait(_event_set, _timeout_ms):
        if not pending:
            raise err(real.NVML_ERROR_TIMEOUT)
        index, xid = pending.pop(0)
        # c_nvmlEventData_t: device, eventType, eventData, gpuInstanceId, computeInstanceId
        return types.SimpleNamespace(
            device=handles[index],
            eventType=real.nvmlEventTypeXidCriticalError,
            eventData=xid,
            gpuInstanceId=0xFFFFFFFF,
            computeInstanceId=0xFFFFFFFF,
        )

    def retired(h):
        if h.gpu.retired_pending is None:
            raise err(real.NVML_ERROR_NOT_SUPPORTED)
        return int(h.gpu.retired_pending)

    def remapped(h):
        if h.gpu.remap is None:
            raise err(real.NVML_ERROR_NOT_SUPPORTED)
        return h.gpu.remap

    def ecc(h, _kind, _counter):
        if h.gpu.ecc_uncorrected is None:
            raise err(real.NVML_ERROR_NOT_SUPPORTED)
        return h.gpu.ecc_uncorrected

    nv.__dict__.update(
        nvmlInit=lambda: None,
        nvmlShutdown=lambda: None,
        nvmlDeviceGetCount=lambda: len(handles),
        nvmlDeviceGetHandleByIndex=by_index,
        nvmlDeviceGetIndex=lambda h: h.index,
        nvmlDeviceGetUUID=lambda h: h.mig or h.gpu.uuid,
        nvmlDeviceGetMaxMigDeviceCount=max_mig,
        nvmlDeviceGetMigDeviceHandleByIndex=mig_by_index,
        nvmlDeviceGetComputeRunningProcesses=compute_procs,
        nvmlDeviceGetUtilizationRates=util,
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(
            total=80 << 30, used=h.gpu.mem_used, free=(80 << 30) - h.gpu.mem_used
        ),
        nvmlDeviceGetPowerUsage=lambda h: int(70_000 + 6_000 * h.gpu.util),  # milliwatts
        nvmlDeviceGetTemperature=lambda h, sensor: 40 + int(h.gpu.util) // 3,
        nvmlDeviceGetTotalEccErrors=ecc,
        nvmlDeviceGetRetiredPagesPendingStatus=retired,
        nvmlDeviceGetRemappedRows=remapped,
        nvmlDeviceGetCurrentClocksThrottleReasons=lambda h: h.gpu.throttle_reasons,
        nvmlDeviceGetClockInfo=lambda h, clock: h.gpu.sm_clock_mhz,
        nvmlDeviceGetMaxClockInfo=lambda h, clock: 1980,
        nvmlEventSetCreate=lambda: object(),
        nvmlDeviceRegisterEvents=lambda h, types_, event_set: None,
        nvmlEventSetWait_v2=wait,
    )
    return nv


def eight_gpus(util: list[float], pids: dict[int, list[int]] | None = None) -> list[Gpu]:
    """Eight GPUs with the given utilisations and, per index, the pids running on it."""
    return [
        Gpu(uuid=f"GPU-{i:08x}-1111-2222-3333-444455556666", util=u, pids=list((pids or {}).get(i, [])))
        for i, u in enumerate(util)
    ]
