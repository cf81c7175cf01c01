"""A job's goodput ledger (orchestrator/goodput): where each node-second went, and interval advice."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, status

from orchestrator.api.deps import SessionDep, UserDep
from orchestrator.api.schemas import AUTH_ERRORS, GoodputOut
from orchestrator.goodput import ledger_for
from orchestrator.store import repo

router = APIRouter(prefix="/v1/jobs", tags=["jobs"], responses=AUTH_ERRORS)


@router.get("/{job_ref}/goodput", response_model=GoodputOut)
def goodput(s: SessionDep, job_ref: str, who: UserDep) -> dict:
    """The job's ledger: productive step time and badput by cause, summing to wall time × nodes;
    its timeline as contiguous segments; each fault's detection delay and redone steps; advice."""
    try:
        job = repo.get_job(s, who.tenant, job_ref)
    except repo.NotFound:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no job {job_ref!r}") from None
    return ledger_for(s, job)
