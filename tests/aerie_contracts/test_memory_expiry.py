"""Which memory checkpoints no restart can use any more (aerie_contracts.checkpoints.expired_memory):
never durable, each gone with its reason."""

from __future__ import annotations

from aerie_contracts.checkpoints import (
    MEMORY_GONE_ATTEMPT_ENDED,
    MEMORY_GONE_JOB_ENDED,
    MEMORY_GONE_LOST,
    expired_memory,
    memory_uri,
)


def _mem(step: int, attempt: int, state: str = "good") -> dict:
    return {
        "uri": memory_uri("j", step, attempt),
        "step": step,
        "state": state,
        "tier": "memory",
        "attempt_id": f"j-a{attempt}",
    }


def _s3(step: int, state: str = "good") -> dict:
    return {
        "uri": f"s3://b/j/step_{step:08d}/attempt_0001",
        "step": step,
        "state": state,
        "tier": "s3",
        "attempt_id": "j-a1",
    }


def test_older_than_the_newest_good_of_either_tier_goes_the_newest_stays():
    rows = [_s3(10), _mem(8, 1), _mem(10, 1), _mem(12, 1), _mem(16, 1), _mem(20, 1, "incomplete"), _s3(30, "bad")]
    gone = expired_memory(rows)
    assert gone == {
        memory_uri("j", 8, 1): "older than the durable (S3) checkpoint of step 10",
        memory_uri("j", 10, 1): "replaced by the memory checkpoint of step 16",
        memory_uri("j", 12, 1): "replaced by the memory checkpoint of step 16",
    }  # 16 (the newest good), 20 (may still become good); a bad S3 row does not count
    assert expired_memory([_s3(16), _mem(16, 1)]) == {}  # same step: memory restores without S3


def test_ended_attempts_lost_nodes_and_the_job_s_end():
    rows = [_mem(16, 1), _mem(20, 1, "incomplete"), _mem(24, 2, "incomplete")]
    assert expired_memory(rows, ended_attempts={"j-a1"}) == {memory_uri("j", 20, 1): MEMORY_GONE_ATTEMPT_ENDED}
    assert set(expired_memory(rows, lost_attempts={"j-a1"}).values()) == {MEMORY_GONE_LOST}
    assert len(expired_memory(rows, lost_attempts={"j-a1"})) == 2
    assert expired_memory(rows, job_over=True) == {r["uri"]: MEMORY_GONE_JOB_ENDED for r in rows}
    deleted = {**_mem(4, 1), "state": "deleted"}
    assert expired_memory([deleted], job_over=True) == {}  # gone already
