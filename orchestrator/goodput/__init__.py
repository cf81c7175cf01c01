"""Goodput: where every second of a job went, Prometheus metrics, and checkpoint-interval advice.

`trace` reads a job's recorded history from the store; `ledger` splits its timeline into productive
time and badput by cause (aerie_contracts.goodput); `advice` computes the Young–Daly checkpoint
interval; `prometheus` exposes the fleet at `/metrics`.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from orchestrator.goodput import advice, ledger, trace
from orchestrator.store.models import Job


def ledger_for(s: Session, job: Job, now: float | None = None) -> dict[str, Any]:
    """The job's ledger with its checkpoint-interval advice, recomputed from the store."""
    t = trace.read(s, job, now)
    return ledger.compute(t, advice.for_job(s, t))


__all__ = ["advice", "ledger", "ledger_for", "trace"]
