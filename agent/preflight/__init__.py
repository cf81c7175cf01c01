"""Pre-flight: the checks a node agent runs before its ranks start in a new attempt (issue #23).

`run_checks` measures, within the spec's time budget (`health.preflight.budget_s`), and judges:

- `compute`: a matmul burn (`burn_s`) on each accelerator: one CPU core's GFLOP/s against
  `min_cpu_gflops`, or each GPU's TFLOP/s against `min_gpu_tflops` (agent/preflight/probe.py,
  a subprocess: numpy on CPU, torch on a GPU node only); skipped where that is missing;
- `gpu_health`: NVML ECC / retired pages / hardware slowdown / XIDs (agent/preflight/gpu.py);
- `host_memory` and `shm`: available memory, and free space where the memory checkpoint tier
  writes (agent/preflight/host.py);
- `store`: PUT + HEAD + DELETE of a probe object under the job's checkpoint prefix (store.py);
- `collective`: with more than one node, an all-reduce of `collective_mb` and each node's
  outgoing link rate to its ring successor against `min_link_gbps` (probe.py: TCP, no torch).

The probe subprocess starts first and runs beside the host checks. Faults for tests come from
`AERIE_PREFLIGHT_FAULT` (aerie_contracts.preflight.Fault). agent/preflight/node.py reports the
result and waits for the attempt's decision.
"""

from __future__ import annotations

import contextlib
import json
import logging
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aerie_contracts import env as E
from aerie_contracts.health import PreflightSettings
from aerie_contracts.preflight import Check, CheckResult, Fault, PreflightResult, parse_faults
from agent.preflight import gpu as gpu_check
from agent.preflight import host as host_checks
from agent.preflight import shape
from agent.preflight import store as store_check
from agent.preflight.checks import at_least, result, skipped
from agent.preflight.probe import TAG

log = logging.getLogger("aerie.agent")

RENDEZVOUS_MARGIN_S = 5.0  # the collective's rendezvous gives up this long before the budget ends


@dataclass(frozen=True)
class Node:
    """Where this node sits in the attempt (from the agent's configuration)."""

    host: str
    hosts: tuple[str, ...]
    master_addr: str
    master_port: int
    attempt: str = ""
    procs: int = 1
    interface: str = ""  # the node's own network interface (platform identity); "" or "lo": shared

    @property
    def rank(self) -> int:
        return self.hosts.index(self.host)


def run_checks(settings: PreflightSettings, node: Node, env: Mapping[str, str], nvml: Any = None) -> PreflightResult:
    t0 = time.perf_counter()
    deadline = t0 + settings.budget_s
    try:
        faults = parse_faults(env.get(E.PREFLIGHT_FAULT), node.host)
    except ValueError as exc:
        bad = result(Check.COMPUTE, False, f"{E.PREFLIGHT_FAULT}: {exc}")
        return _finish(node, settings, [bad], t0, [])
    if faults:
        log.warning("pre-flight on %s with injected faults: %s", node.host, ", ".join(faults))
    gpus = gpu_check.GpuHealth(env, nvml)
    # The injected slow link: a real throttled link where this node has one of its own.
    slow = Fault.SLOW_LINK in faults and len(node.hosts) > 1
    shaping = shape.throttled(node.interface, _throttle_bps(settings)) if slow else contextlib.nullcontext()
    with shaping as shaped:
        checks = _measure(settings, node, env, faults, gpus, deadline, shaped)
    return _finish(node, settings, checks, t0, faults)


def _measure(
    settings: PreflightSettings,
    node: Node,
    env: Mapping[str, str],
    faults: list[Fault],
    gpus: gpu_check.GpuHealth,
    deadline: float,
    shaped: str | None,
) -> list[CheckResult]:
    probe = _start_probe(settings, node, deadline, faults, bool(gpus.gpus), shaped is None)
    checks: list[CheckResult] = [
        host_checks.host_memory(settings),
        host_checks.shm(settings, env, node.procs, faults),
        store_check.store(
            env,
            node.host,
            node.attempt,
            min(settings.store_timeout_s, max(1.0, deadline - time.perf_counter())),
            faults,
        ),
    ]
    measured, probe_s = _wait_probe(probe, deadline)
    checks.insert(0, _judge_compute(settings, measured, probe_s, bool(gpus.gpus)))
    checks.insert(1, gpus.finish(settings))
    checks.append(_judge_collective(settings, node, measured, probe_s, shaped))
    return checks


def _throttle_bps(settings: PreflightSettings) -> float:
    """The injected slow link's rate (bytes/s): a quarter of the minimum link rate (50 Mbit/s when
    the minimum is the default 0.2 Gbit/s)."""
    return (settings.min_link_gbps or 0.2) / 4 * 1e9 / 8


def _finish(
    node: Node, settings: PreflightSettings, checks: list[CheckResult], t0: float, faults: list[Fault]
) -> PreflightResult:
    elapsed = time.perf_counter() - t0
    return {
        "host": node.host,
        "passed": all(c["passed"] for c in checks),
        "checks": checks,
        "elapsed_s": round(elapsed, 3),
        "budget_s": settings.budget_s,
        "t": time.time(),
        "faults": [str(f) for f in faults],
    }


def _start_probe(
    settings: PreflightSettings, node: Node, deadline: float, faults: list[Fault], gpus: bool, sleep_slow: bool = True
) -> subprocess.Popen[str]:
    remaining = deadline - time.perf_counter()
    cfg = {
        "matrix_n": settings.matrix_n,
        "burn_s": min(settings.burn_s, max(0.1, remaining / 4)),
        "min_rate": settings.min_gpu_tflops if gpus else settings.min_cpu_gflops,
        "slow_compute": Fault.SLOW_COMPUTE in faults,
        "gpus": gpus,
        "nodes": len(node.hosts),
        "node_rank": node.rank,
        "master_addr": node.master_addr,
        "port": node.master_port,
        "collective_mb": settings.collective_mb,
        "timeout_s": max(5.0, remaining - RENDEZVOUS_MARGIN_S),
        # the injected slow link where no qdisc could make it real (agent/preflight/shape.py): the
        # probe's sender sleeps as a link at `throttle_bps` would make it wait
        "slow_link": Fault.SLOW_LINK in faults and sleep_slow,
        "throttle_bps": _throttle_bps(settings),
    }
    return subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name("probe.py")), json.dumps(cfg)],  # a script: no package imports
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )


def _wait_probe(probe: subprocess.Popen[str], deadline: float) -> tuple[dict[str, Any], float]:
    """The probe's measurements (`{"error": ...}` when it did not finish in the budget)."""
    t0 = time.perf_counter()
    try:
        out, _ = probe.communicate(timeout=max(1.0, deadline - time.perf_counter()))
    except subprocess.TimeoutExpired:
        probe.kill()
        probe.communicate()
        return {"error": "timed out", "timed_out": True}, time.perf_counter() - t0
    lines = [ln for ln in (out or "").splitlines() if ln.startswith(TAG)]
    if not lines:
        return {"error": f"no result (exit {probe.returncode}): {(out or '')[-300:]}"}, time.perf_counter() - t0
    try:
        return json.loads(lines[-1][len(TAG) :]), time.perf_counter() - t0
    except ValueError:
        return {"error": f"unreadable result: {lines[-1][:200]}"}, time.perf_counter() - t0


def _judge_compute(settings: PreflightSettings, measured: dict[str, Any], seconds: float, gpus: bool) -> CheckResult:
    burn = measured.get("burn")
    if not isinstance(burn, dict):
        why = measured.get("burn_error") or measured.get("error") or "no measurement"
        if "not importable" in str(why):
            return skipped(Check.COMPUTE, str(why), seconds)
        return result(Check.COMPUTE, False, f"burn failed: {why}", seconds=seconds)
    if "gpu_tflops" in burn:
        rates = {k: float(v) for k, v in burn["gpu_tflops"].items()}
        slowest = min(rates, key=rates.__getitem__) if rates else None
        if slowest is None:
            return skipped(Check.COMPUTE, "no CUDA device to burn", seconds)
        return at_least(
            Check.COMPUTE,
            rates[slowest],
            settings.min_gpu_tflops,
            "TFLOP/s",
            seconds,
            f"slowest GPU ({slowest})",
            per_gpu=rates,
            timings=measured.get("timings"),
        )
    return at_least(
        Check.COMPUTE,
        float(burn["cpu_gflops"]),
        settings.min_cpu_gflops,
        "GFLOP/s",
        seconds,
        "one CPU core",
        gpus_seen=gpus,
        timings=measured.get("timings"),  # the probe: interpreter and numpy import, burn, collective
    )


def _judge_collective(
    settings: PreflightSettings, node: Node, measured: dict[str, Any], seconds: float, shaped: str | None = None
) -> CheckResult:
    if len(node.hosts) < 2:
        return skipped(Check.COLLECTIVE, "one node: no collective", 0.0)
    got = measured.get("collective")
    if not isinstance(got, dict):
        why = measured.get("collective_error") or measured.get("error") or "no measurement"
        if "not importable" in str(why):
            return skipped(Check.COLLECTIVE, str(why), seconds)
        # A peer that never joined (or died) is not this node's fault: the peer's own result, or
        # its loss, says whose it is.
        return skipped(Check.COLLECTIVE, f"not measured: {why}", seconds)
    links = got.get("links_gbps") or []
    mine = float(links[node.rank]) if node.rank < len(links) else 0.0
    successor = node.hosts[(node.rank + 1) % len(node.hosts)]
    details = {k: got.get(k) for k in ("bytes", "allreduce_s", "allreduce_busbw_gbps", "links_gbps", "joined_s")}
    if shaped:
        details["shaped"] = shaped  # the injected slow link was a real qdisc, not the probe's sleep
    if not got.get("sum_ok", True):
        return result(Check.COLLECTIVE, False, "the all-reduce returned a wrong sum", seconds=seconds, **details)
    return at_least(
        Check.COLLECTIVE, mine, settings.min_link_gbps, "Gbit/s", seconds, f"link to {successor}", **details
    )
