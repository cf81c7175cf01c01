"""`last_good` across the tiers (recovery/resume.py, through lambdas/chain_restart.py): the newest
good checkpoint that survives the restart mode. A memory checkpoint does where its nodes' memory does (in place; a local
relaunch), and only if every attempt since the one that wrote it kept that memory; a relaunch that
loses the memory marks its records gone. Real API over HTTP, store on SQLite."""

from __future__ import annotations

from aerie_contracts.checkpoints import MEMORY_GONE_LOST, memory_uri
from aerie_contracts.restarts import RestartMode
from lambdas import chain_restart
from orchestrator.store import repo
from recovery import resume
from tests.lambdas.test_chain_restart import _ctx, _event, _job, _with_nodes


def _memory_checkpoint(api, job_id: str, step: int) -> str:
    with api.db.session() as s:
        attempt = repo.get_job(s, "default", job_id).attempts[0]
        uri = memory_uri(job_id, step, 1)
        meta = {"ranks": [0, 1], "world_size": 2, "node": "algo-1", "replica_node": "algo-2", "size_bytes": 1}
        # Recorded while attempt 1 was current (a memory checkpoint is fenced like an S3 one).
        attempt.state = "Running"
        repo.record_checkpoint(s, attempt, step, uri, meta, tier="memory")
        attempt.state = "Failed"
    return uri


def _rows(api, job_id: str) -> dict[int, tuple[str, str | None]]:
    with api.db.session() as s:
        return {c.step: (c.state, c.reason) for c in repo.list_checkpoints(s, repo.get_job(s, "default", job_id))}


def test_in_place_resumes_from_the_newest_good_memory_checkpoint(api):
    job_id = _job(api, failed={"kind": "exit.nonzero", "exit_code": 1, "host": "algo-2"})
    _with_nodes(api, job_id)
    uri = _memory_checkpoint(api, job_id, 12)
    result = chain_restart.handler(_event(job_id, reason={"kind": "exit.nonzero", "exit_code": 1}), _ctx(api))
    assert result["mode"] == "in_place" and result["resume_from"] == uri, result
    with api.db.session() as s:
        cause = repo.get_job(s, "default", job_id).attempts[1].cause
    assert cause["resume_fallback"] is None and cause["memory_nodes"]["algo-1"]["replica_node"] == "algo-2"


def test_a_relaunch_that_loses_the_memory_resumes_durably_and_marks_it_gone(api):
    """On a backend whose relaunch starts on fresh nodes, the memory checkpoint is not there any
    more: the resume point is S3's (here none: scratch), and the record says why it is gone."""
    # SageMaker after a lost instance: a relaunch is a new training job (in place, its agents and
    # their memory would have stayed: Slurm's and SageMaker's restart in place too).
    lost = {"kind": "node.lost", "host": "algo-2", "message": "training job ended"}
    job_id = _job(api, {"backend": "sagemaker"}, failed=lost)
    _with_nodes(api, job_id)
    _memory_checkpoint(api, job_id, 12)
    result = chain_restart.handler(_event(job_id, reason=lost), _ctx(api))
    assert result["mode"] == "relaunch" and result["resume_from"] is None, result
    assert _rows(api, job_id)[12] == ("deleted", MEMORY_GONE_LOST)


def test_which_attempts_memory_survives():
    def attempt(number: int, mode: str | None) -> dict:
        return {"number": number, "id": f"j-a{number}", "cause": {"mode": mode} if mode else None}

    chain = [attempt(1, None), attempt(2, "relaunch"), attempt(3, "in_place"), attempt(4, "in_place")]
    slurm = {"backend": "slurm", "attempt_list": chain}
    # Attempt 5 in place after 4: 4's memory, 3's (4 started in place), 2's (3 did); not 1's (2 was
    # a relaunch on fresh nodes).
    assert resume.memory_survivors(slurm, 4, RestartMode.IN_PLACE) == {"j-a4", "j-a3", "j-a2"}
    assert resume.memory_survivors(slurm, 4, RestartMode.RELAUNCH) == set()
    local = {"backend": "local", "attempt_list": chain}  # a local relaunch keeps every node's area
    assert resume.memory_survivors(local, 4, RestartMode.RELAUNCH) == {"j-a1", "j-a2", "j-a3", "j-a4"}
