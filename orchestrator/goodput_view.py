"""How the CLI shows a goodput ledger (aerie goodput, aerie describe): rich tables and one-liners.

Torch- and store-free: it formats the API's JSON (aerie_contracts.goodput) only.
"""

from __future__ import annotations

from typing import Any

from rich.table import Table

from aerie_contracts.goodput import LABELS, Category


def _hms(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.1f}s"
    if seconds < 7200:
        return f"{seconds / 60:.1f}m"
    return f"{seconds / 3600:.1f}h"


def table(led: dict[str, Any]) -> Table:
    total = led["node_seconds"] or 1.0
    t = Table("CATEGORY", "NODE-TIME", "PER NODE", "SHARE", title=f"goodput of {led['name']} ({led['nodes']} nodes)")
    for cat in Category:
        v = led["categories"].get(cat.value, 0.0)
        t.add_row(LABELS[cat], _hms(v), _hms(v / max(1, led["nodes"])), f"{100 * v / total:.1f}%")
    t.add_row("[bold]total[/bold] (wall × nodes)", _hms(led["node_seconds"]), _hms(led["wall_s"]), "100.0%")
    return t


def faults_table(faults: list[dict[str, Any]]) -> Table:
    t = Table(
        "ATTEMPT",
        "FAILURE",
        "LAST STEP",
        "DETECTED AFTER",
        "RESTART",
        "DETECTED → FIRST STEP",
        "RESUMED AT",
        "REDONE STEPS",
        "REDONE",
    )
    for f in faults:
        t.add_row(
            str(f["attempt"]),
            f.get("kind") or "",
            str(f["last_step"]),
            _hms(f["detection_s"]),
            (f.get("restart_mode") or "").replace("_", " "),
            "" if f.get("recovery_s") is None else f"{f['recovery_s']:.1f}s",
            "" if f.get("resumed_step") is None else str(f["resumed_step"]),
            str(f.get("redone_steps", 0)),
            _hms(f.get("redone_s", 0.0)),
        )
    return t


def summary(led: dict[str, Any]) -> str:
    """One line: goodput and the three largest causes of badput."""
    total = led["node_seconds"] or 1.0
    bad = sorted(((v, k) for k, v in led["categories"].items() if k != Category.PRODUCTIVE and v > 0), reverse=True)[:3]
    causes = ", ".join(f"{LABELS.get(k, k)} {100 * v / total:.1f}%" for v, k in bad) or "none"
    return (
        f"goodput {100 * led['goodput']:.1f}% of {_hms(led['node_seconds'])} node-time "
        f"({led['nodes']} nodes × {_hms(led['wall_s'])}); badput: {causes}"
    )


TIER_NAMES = {"s3": "S3 tier (checkpoint.every_steps)", "memory": "memory tier (checkpoint.memory_every_steps)"}


def advice_line(adv: dict[str, Any]) -> str:
    """One tier's advice: the Young–Daly interval, and the expected badput now against advised."""
    advised = f"every {adv['advised_every_steps']} steps (~{_hms(adv['advised_interval_s'])})"
    now = ""
    if adv.get("current_every_steps") and adv.get("current_badput") is not None:
        now = (
            f"; now every {adv['current_every_steps']} steps (~{_hms(adv['current_interval_s'])}): "
            f"expected checkpoint badput {100 * adv['current_badput']:.2f}%"
            f" vs {100 * adv['advised_badput']:.2f}% advised"
        )
    tier = TIER_NAMES.get(adv.get("tier", "s3"), adv.get("tier", ""))
    return (
        f"checkpoint interval advice, {tier}: {advised}{now} "
        f"(Young–Daly √(2·C·MTBF), C={_hms(adv['save_stall_s'])} stall, MTBF {_hms(adv['mtbf_s'])} "
        f"from {adv['mtbf_source']}, counting {adv.get('failures', 'every failure')})"
    )


def advice_lines(led: dict[str, Any]) -> list[str]:
    """Every tier's advice line (an older control plane sent one S3 advice, not a list)."""
    advice = led.get("advice") or []
    return [advice_line(a) for a in (advice if isinstance(advice, list) else [advice])]
