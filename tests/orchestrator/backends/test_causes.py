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


def _local_failed(first: dict, ended_at: float) -> PollResult:
    # The local backend read one node's exit.json; its peer is still stopping its ranks.
    nodes = (NodeStatus("algo-1", "Failed", 1, first, ended_at), NodeStatus("algo-2", "Running"))
    return PollResult("Failed", nodes, first, 1)


def test_a_verdict_posted_before_a_peers_collateral_exit_is_the_cause():
    """algo-2's agent saw the NaN, posted its verdict and stopped its rank; algo-1's rank lost its
    collective and its exit.json came first. The verdict, earlier, is the cause."""
    launcher = {"kind": "exit.nonzero", "host": "algo-1", "exit_code": 1, "message": "launcher exited with code 1"}
    message = "rank 1 logged a non-finite loss (nan) at step 12"
    nan = {"kind": "loss.nan", "host": "algo-2", "message": message, "t": 100.0}
    result = first_reported_cause(_local_failed(launcher, 101.0), {}, [nan])
    assert result.reason == {"kind": "loss.nan", "host": "algo-2", "message": nan["message"], "at": 100.0}
    assert result.exit_code == 1 and result.state == "Failed"


def test_a_failure_before_any_verdict_and_report_only_verdicts_stay_the_cause():
    crash = {"kind": "exit.nonzero", "host": "algo-1", "rank": 0, "exit_code": 1, "at": 100.0}
    later_hang = {"kind": "silent.hang", "host": "algo-2", "message": "hung", "t": 130.0}
    assert first_reported_cause(_local_failed(crash, 100.5), {}, [later_hang]).reason == crash
    straggler = {"kind": "node.straggler", "host": "algo-2", "message": "slow", "t": 50.0}
    sdc = {"kind": "sdc.suspect", "host": "algo-2", "message": "replayed", "t": 60.0}
    assert first_reported_cause(_local_failed(crash, 100.5), {}, [straggler, sdc]).reason == crash
