"""One check's result (`aerie_contracts.preflight.CheckResult`), built the same way by every check."""

from __future__ import annotations

from typing import Any

from aerie_contracts.preflight import Check, CheckResult


def result(
    check: Check,
    passed: bool,
    reason: str,
    *,
    value: float | None = None,
    threshold: float | None = None,
    unit: str = "",
    seconds: float = 0.0,
    skipped: bool = False,
    **details: Any,
) -> CheckResult:
    out: CheckResult = {
        "check": check.value,
        "passed": bool(passed),
        "skipped": skipped,
        "value": None if value is None else round(float(value), 4),
        "threshold": None if threshold is None else float(threshold),
        "unit": unit,
        "reason": reason,
        "seconds": round(seconds, 3),
    }
    if details:
        out["details"] = details
    return out


def skipped(check: Check, reason: str, seconds: float = 0.0, **details: Any) -> CheckResult:
    """Nothing to check on this node (no GPU, no store, one node): counts as passed."""
    return result(check, True, reason, skipped=True, seconds=seconds, **details)


def at_least(
    check: Check, value: float, floor: float, unit: str, seconds: float, what: str, **details: Any
) -> CheckResult:
    """`value` held to the floor `floor` (a floor of 0 only reports)."""
    if floor > 0 and value < floor:
        return result(
            check,
            False,
            f"{what} {value:.3g} {unit} < {floor:g}",
            value=value,
            threshold=floor,
            unit=unit,
            seconds=seconds,
            **details,
        )
    return result(
        check, True, f"{what} {value:.3g} {unit}", value=value, threshold=floor, unit=unit, seconds=seconds, **details
    )
