"""A failed attempt's cause: the first failure its nodes' agents reported, not the backend's pick."""

from __future__ import annotations

from orchestrator.backends.base import NodeStatus, PollResult, first_reported_cause

KILLED = {"kind": "exit.nonzero", "host": "algo-2", "rank": 1, "exit_code": 137, "signal": 9, "at": 100.0}
COLLATERAL = {"kind": "exit.nonzero", "host": "algo-1", "rank": 0, "exit_code": 1, "at": 101.5}


def _sagemaker_failed(quoted: dict) -> PollResult:
    # SageMaker's FailureReason names one instance's failure, on every host alike.
    nodes = tuple(NodeStatus(h, "Failed", quoted["exit_code"], quoted) for h in ("algo-1", "algo-2"))
    return PollResult("Failed", nodes, quoted, quoted["exit_code"])


def test_the_first_rank_to_fail_is_the_cause_whichever_instance_the_backend_quotes():
    reported = {
        "algo-1": {"exit_code": 1, "reason": COLLATERAL, "t": 102.0},
        "algo-2": {"exit_code": 137, "reason": KILLED, "t": 103.0},
    }
    result = first_reported_cause(_sagemaker_failed({"kind": "exit.nonzero", "exit_code": 1}), reported)
    assert (result.reason, result.exit_code) == (KILLED, 137)


def test_a_verdict_or_platform_cause_and_stopped_peers_are_left_alone():
    hang = {"kind": "silent.hang", "exit_code": 1}
    reported = {"algo-1": {"exit_code": 1, "reason": COLLATERAL, "t": 102.0}}
    assert first_reported_cause(_sagemaker_failed(hang), reported).reason == hang
    stopped = {"algo-1": {"exit_code": 143, "reason": {"kind": "user.stop"}, "t": 102.0}}
    quoted = {"kind": "exit.nonzero", "exit_code": 137}
    assert first_reported_cause(_sagemaker_failed(quoted), stopped).reason == quoted
    assert first_reported_cause(_sagemaker_failed(quoted), {}).reason == quoted
