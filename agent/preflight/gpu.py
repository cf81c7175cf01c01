"""GPU health from NVML (nvidia-ml-py), around the compute burn: volatile uncorrected ECC errors,
retired pages pending (before Ampere) or row remapping pending/failed (A100, H100: their
retired-pages call answers NotSupported), a hardware clock slowdown, and XID critical errors
raised while the checks ran (NVML reports XIDs only as events after registration, so earlier ones
are not seen here; the monitor's probe counts them during training). Skipped cleanly without NVML
or a visible GPU. On an idle H100 (device machine): ECC 0, throttle reasons 0x1 (idle), healthy."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from aerie_contracts.health import PreflightSettings
from aerie_contracts.preflight import Check, CheckResult
from agent import devices
from agent.preflight.checks import result, skipped

# nvmlClocksThrottleReasons bits that mean the hardware, not the workload, slows the clocks.
HW_SLOWDOWN = 0x8 | 0x40 | 0x80  # HwSlowdown, HwThermalSlowdown, HwPowerBrakeSlowdown


class GpuHealth:
    """Opened before the burn (XID events registered), judged after it (`finish`)."""

    def __init__(self, env: Mapping[str, str], nvml: Any = None):
        self.t0 = time.perf_counter()
        self.nv = nvml
        self.handles: dict[int, Any] = {}
        self.events: Any = None
        self.error = ""
        try:
            if self.nv is None:
                import pynvml

                self.nv = pynvml
            self.nv.nvmlInit()
            count = int(self.nv.nvmlDeviceGetCount())
            all_handles = [self.nv.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
            described = [(i, self._call(self.nv.nvmlDeviceGetUUID, h), ()) for i, h in enumerate(all_handles)]
            self.handles = {i: all_handles[i] for i in devices.visible(env).pick(described)}
        except Exception as exc:  # no library, no driver, no GPU
            self.error = str(exc) or type(exc).__name__
            self.handles = {}
            return
        try:
            self.events = self.nv.nvmlEventSetCreate()
            for h in self.handles.values():
                self._call(self.nv.nvmlDeviceRegisterEvents, h, self.nv.nvmlEventTypeXidCriticalError, self.events)
        except Exception:
            self.events = None

    @property
    def gpus(self) -> list[int]:
        return sorted(self.handles)

    def _call(self, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except Exception:
            return None

    def _xids(self) -> dict[int, list[int]]:
        out: dict[int, list[int]] = {}
        if self.events is None:
            return out
        for _ in range(64):
            ev = self._call(self.nv.nvmlEventSetWait_v2, self.events, 0)
            if ev is None:
                break
            index = self._call(self.nv.nvmlDeviceGetIndex, ev.device)
            out.setdefault(int(index) if index is not None else -1, []).append(int(ev.eventData))
        return out

    def finish(self, settings: PreflightSettings) -> CheckResult:
        if not self.handles:
            why = f"no NVML ({self.error})" if self.error else "no visible GPU"
            return skipped(Check.GPU_HEALTH, why, time.perf_counter() - self.t0)
        nv, xids = self.nv, self._xids()
        per_gpu: dict[str, dict[str, Any]] = {}
        problems: list[str] = []
        for i, h in self.handles.items():
            ecc = self._call(
                nv.nvmlDeviceGetTotalEccErrors, h, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC
            )
            pending = self._call(nv.nvmlDeviceGetRetiredPagesPendingStatus, h)
            # (corrected rows, uncorrected rows, remapping pending, remapping failed)
            remap = self._call(nv.nvmlDeviceGetRemappedRows, h)
            reasons = self._call(nv.nvmlDeviceGetCurrentClocksThrottleReasons, h)
            sm = self._call(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM)
            sm_max = self._call(nv.nvmlDeviceGetMaxClockInfo, h, nv.NVML_CLOCK_SM)
            per_gpu[str(i)] = {
                "ecc_uncorrected": ecc,
                "retired_pages_pending": bool(pending) if pending is not None else None,
                "row_remap": list(remap) if isinstance(remap, (list, tuple)) else None,
                "hw_slowdown": bool(reasons & HW_SLOWDOWN) if isinstance(reasons, int) else None,
                "sm_clock_mhz": sm,
                "sm_clock_max_mhz": sm_max,
                "xids": xids.get(i, []),
            }
            if isinstance(ecc, int) and ecc > settings.max_gpu_ecc_errors:
                problems.append(f"GPU {i}: {ecc} uncorrected ECC errors > {settings.max_gpu_ecc_errors}")
            if pending:
                problems.append(f"GPU {i}: retired pages pending (needs a reset)")
            if isinstance(remap, (list, tuple)) and len(remap) >= 4 and (remap[2] or remap[3]):
                what = "failed" if remap[3] else "pending (needs a reset)"
                problems.append(f"GPU {i}: row remapping {what}")
            if isinstance(reasons, int) and reasons & HW_SLOWDOWN:
                problems.append(f"GPU {i}: hardware clock slowdown (reasons {reasons:#x})")
            if xids.get(i):
                problems.append(f"GPU {i}: XID {', '.join(map(str, xids[i]))} during the checks")
        took = time.perf_counter() - self.t0
        self._call(nv.nvmlShutdown)
        if problems:
            return result(
                Check.GPU_HEALTH,
                False,
                "; ".join(problems),
                value=len(problems),
                threshold=0,
                unit="problems",
                seconds=took,
                gpus=per_gpu,
            )
        return result(
            Check.GPU_HEALTH,
            True,
            f"{len(per_gpu)} GPU(s) healthy",
            value=0,
            threshold=0,
            unit="problems",
            seconds=took,
            gpus=per_gpu,
        )
