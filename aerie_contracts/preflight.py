"""Pre-flight checks: what each node agent measures before its ranks start, and how it is reported.

A node runs every check (agent/preflight/), posts its `PreflightResult` to the control plane
(`POST /v1/attempts/{a}/nodes/{host}/preflight`, stored on the node's row and emitted as
`Aerie Preflight Checked`), and waits for the attempt's decision (`GET .../preflight`): start when
every node of the attempt passed, abort when one failed. A node that failed ends with
`preflight.failed` (blaming itself) and never starts its ranks. The thresholds are
`aerie_contracts.health.PreflightSettings` (`health.preflight` in the spec).

Standard library only (it ships in the Lambda bundle and the torch-free agent).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypedDict

from aerie_contracts._strenum import StrEnum


class Check(StrEnum):
    COMPUTE = "compute"  # a matmul burn on each accelerator (CPU: GFLOP/s; GPU: TFLOP/s per device)
    GPU_HEALTH = "gpu_health"  # NVML: ECC errors, retired pages pending, hardware clock slowdown
    HOST_MEMORY = "host_memory"  # available host memory (MiB)
    SHM = "shm"  # free space where the memory checkpoint tier writes (/dev/shm)
    STORE = "store"  # the checkpoint store: PUT + HEAD + DELETE of a probe object under the job's prefix
    COLLECTIVE = "collective"  # all-reduce across the attempt's nodes + this node's outgoing link rate


class Decision(StrEnum):
    """The answer to `GET .../preflight`: what a node that passed does next."""

    WAIT = "wait"  # some node has not reported yet
    START = "start"  # every node of the attempt passed: start the ranks
    ABORT = "abort"  # a node failed (or the attempt ended): start nothing


class Fault(StrEnum):
    """Injected through `AERIE_PREFLIGHT_FAULT` (`cause[@host],...`), so each path is tested."""

    SLOW_COMPUTE = "slow_compute"  # the burn sleeps between matmuls: a tenth of the minimum rate
    SHM_FULL = "shm_full"  # the shared-memory check sees 0 bytes free
    STORE_UNREACHABLE = "store_unreachable"  # the probe goes to an endpoint nobody listens on
    # this node's sends in the collective throttled to a quarter of the minimum (its egress, like netem)
    SLOW_LINK = "slow_link"


# A node's heartbeat summary while its checks run and it waits for its peers: `phase` (the key of
# aerie_contracts.sagemaker_api.PHASE) is this value.
PHASE_PREFLIGHT = "preflight"


class CheckResult(TypedDict, total=False):
    check: str  # Check
    passed: bool
    skipped: bool  # nothing to check here (no GPU, no checkpoint store, one node): passed
    value: float | None  # what was measured, in `unit`
    threshold: float | None  # the bound it was held to
    unit: str
    reason: str  # one line for people
    seconds: float  # how long the check took
    details: dict[str, Any]


class PreflightResult(TypedDict, total=False):
    host: str
    passed: bool
    checks: list[CheckResult]
    elapsed_s: float  # the whole pre-flight on this node, measured
    budget_s: float
    t: float  # when it finished (UNIX seconds)
    faults: list[str]  # injected faults in force (tests)
    spare: bool  # a hot spare's own checks, alone, while it waits (a node of no attempt yet)


# A hot spare's result is no attempt node's: the control plane keeps it in the attempt's handle
# under this key ({host: PreflightResult}); the API shows it as the attempt's `spare_preflight`.
HANDLE_SPARE_PREFLIGHT = "spare_preflight"


def failed_checks(result: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [c for c in result.get("checks") or [] if isinstance(c, Mapping) and not c.get("passed", False)]


def summary_line(result: Mapping[str, Any]) -> str:
    """`passed in 3.1s` or `FAILED: compute: 0.05 GFLOP/s < 0.5; store: ...` (describe, events)."""
    took = result.get("elapsed_s")
    timing = f" in {took:.1f}s" if isinstance(took, (int, float)) else ""
    bad = failed_checks(result)
    if result.get("passed") and not bad:
        return f"passed{timing}"
    return f"FAILED{timing}: " + "; ".join(f"{c.get('check')}: {c.get('reason', '')}" for c in bad)


def parse_faults(text: str | None, host: str) -> list[Fault]:
    """The faults of `AERIE_PREFLIGHT_FAULT` that apply to `host`: `cause` (every node) or
    `cause@host`, comma separated. An unknown cause is an error (a typo must not test nothing)."""
    out: list[Fault] = []
    for item in (text or "").split(","):
        item = item.strip()
        if not item:
            continue
        cause, _, only = item.partition("@")
        try:
            fault = Fault(cause.strip())
        except ValueError:
            raise ValueError(f"unknown pre-flight fault {cause!r} (known: {', '.join(Fault.values())})") from None
        if not only or only.strip() == host:
            out.append(fault)
    return out
