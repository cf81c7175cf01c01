"""Blame from evidence (`recovery/blame.py`): which node a failed attempt is the fault of.

The two recorded cases are real runs of the tiny trainer on 2 local nodes x 2 ranks (gloo), as
the control plane's `GET /v1/jobs` returned them (tests/data/blame/, evidence trimmed to what
blame reads); the rest are synthetic evidence in the same shape, for what this machine can't
produce (GPUs, one node behind another).
"""

from __future__ import annotations

import json
from pathlib import Path

from recovery.blame import blame_attempt

DATA = Path(__file__).parent.parent / "data" / "blame"
T0 = 1_800_000_000.0


def _recorded(name: str) -> tuple[dict, dict]:
    d = json.loads((DATA / f"{name}.json").read_text())
    return d["job"], d["failed"]


def _hosts(blames: list[dict]) -> list[str]:
    return [b["host"] for b in blames]


def _hang(host: str, step: int, t: float, *, busy=(), idle=(), stopped=(), p95=0.2, at=T0 + 30) -> dict:
    """A silent.hang verdict as the agent posts it (agent/detect.py), two ranks per node."""
    return {
        "attempt_id": "j-a1",
        "host": host,
        "kind": "silent.hang",
        "message": "no step",
        "t": at,
        "evidence": {
            "state": "busy" if busy else "idle",
            "busy": list(busy),
            "idle": list(idle),
            "stopped": [{"rank": r, "state": "stopped"} for r in stopped],
            "step_time_p95": p95,
            "window": {"steps": {"0": [[t - 0.2, step - 1, 2.0, 0.2], [t, step, 2.0, 0.2]]}},
        },
    }


def _case(verdicts: list[dict], reason: dict, nodes=("algo-1", "algo-2"), summaries=None, spec=None):
    summaries = summaries or {}
    job = {"spec": spec or {}, "verdicts": verdicts}
    failed = {
        "id": "j-a1",
        "reason": reason,
        "nodes": [{"host": h, "summary": summaries.get(h), "last_heartbeat_at": None} for h in nodes],
    }
    return job, failed


HANG = {"kind": "silent.hang", "host": "algo-1", "message": "no step"}
CPU = {"accelerator_kind": "cpu"}
GPU = {"accelerator_kind": "nvml"}


def test_recorded_busy_hang_blames_the_spinning_node_only():
    job, failed = _recorded("busy_hang_rank3")
    assert {v["host"] for v in job["verdicts"]} == {"algo-1", "algo-2"}  # both nodes noticed the hang
    blames, _why = blame_attempt(job, failed)
    assert _hosts(blames) == ["algo-2"] and blames[0]["rule"] == "not_waiting", blames
    facts = blames[0]["evidence"]["nodes"]
    # Why "the stalest rank" alone would have been wrong: every rank's last step was the same, and
    # the healthy node logged it first (3 ms earlier).
    assert facts["algo-1"]["last_step"] == facts["algo-2"]["last_step"] == 11
    assert facts["algo-1"]["last_step_t"] < facts["algo-2"]["last_step_t"] < facts["algo-1"]["last_step_t"] + 0.1
    assert facts["algo-2"]["busy"] == ["3"] and facts["algo-1"]["idle"] == ["0", "1"]


def test_recorded_sigstop_blames_the_stopped_node_although_a_healthy_peer_noticed_first():
    job, failed = _recorded("sigstop_rank1")
    assert failed["reason"]["host"] == "algo-2"  # the first to notice, and what the old code blamed too
    blames, _why = blame_attempt(job, failed)
    assert _hosts(blames) == ["algo-1"] and blames[0]["rule"] == "stopped_rank"
    assert blames[0]["why"] == "rank(s) [1] stopped or gone"


def test_loss_verdicts_and_exit_codes_blame_no_node():
    nan = {"attempt_id": "j-a1", "kind": "loss.nan", "message": "nan", "t": T0, "evidence": {}}
    verdicts = [{**nan, "host": "algo-1"}, {**nan, "host": "algo-2"}]
    for reason in (
        {"kind": "loss.nan", "host": "algo-1"},
        {"kind": "loss.spike", "host": "algo-2"},
        {"kind": "exit.nonzero", "host": "algo-2", "exit_code": 1},
    ):
        blames, why = blame_attempt(*_case(verdicts, reason))
        assert blames == [] and why == f"{reason['kind']} blames no node"


def test_a_node_behind_in_steps_is_the_stalest():
    verdicts = [_hang("algo-1", 11, T0), _hang("algo-2", 12, T0 + 0.2)]
    blames, _ = blame_attempt(*_case(verdicts, {**HANG, "host": "algo-2"}))
    assert _hosts(blames) == ["algo-1"] and blames[0]["rule"] == "stalest"
    assert "stopped at step 11 while others reached 12" in blames[0]["why"]


def test_the_same_step_counts_as_stale_only_when_clearly_earlier():
    late = [_hang("algo-1", 11, T0), _hang("algo-2", 11, T0 + 5.0, idle=["2", "3"])]
    blames, _ = blame_attempt(*_case(late, HANG, summaries={"algo-1": CPU, "algo-2": CPU}))
    assert _hosts(blames) == ["algo-1"] and blames[0]["rule"] == "stalest"
    # Lockstep training logs a step on every rank within milliseconds: that is no evidence.
    close = [_hang("algo-1", 11, T0, idle=["0", "1"]), _hang("algo-2", 11, T0 + 0.3, idle=["2", "3"])]
    blames, why = blame_attempt(*_case(close, HANG, summaries={"algo-1": CPU, "algo-2": CPU}))
    assert blames == [] and "no node singled out" in why


def test_on_gpus_the_idle_device_among_spinning_peers_is_blamed_and_all_spinning_blames_nobody():
    """Ranks blocked in an NCCL collective keep their GPU busy: the odd one out is an idle GPU."""
    one_idle = [
        _hang("algo-1", 40, T0, busy=["0", "1", "2", "3"]),
        _hang("algo-2", 40, T0 + 0.01, busy=["0", "1", "3"], idle=["2"]),
    ]
    summaries = {"algo-1": GPU, "algo-2": GPU}
    blames, _ = blame_attempt(*_case(one_idle, HANG, summaries=summaries))
    assert _hosts(blames) == ["algo-2"] and blames[0]["rule"] == "not_waiting"
    all_busy = [_hang("algo-1", 40, T0, busy=["0", "1"]), _hang("algo-2", 40, T0, busy=["0", "1"])]
    assert blame_attempt(*_case(all_busy, HANG, summaries=summaries))[0] == []


def test_a_heartbeat_sent_during_the_stall_speaks_for_a_node_that_raised_no_verdict():
    peer = _hang("algo-1", 11, T0, idle=["0", "1"], at=T0 + 13)
    beat = {
        **CPU,
        "t": T0 + 8,  # during the stall, before any node was stopped
        "last_step": 11,
        "last_step_t": T0,
        "accelerators": [{"index": 2, "util": 0.0}, {"index": 3, "util": 99.0}],
        "processes": [{"rank": 2, "state": "sleeping"}, {"rank": 3, "state": "running"}],
    }
    blames, _ = blame_attempt(*_case([peer], HANG, summaries={"algo-1": CPU, "algo-2": beat}))
    assert _hosts(blames) == ["algo-2"] and blames[0]["evidence"]["nodes"]["algo-2"]["source"] == "heartbeat"
    # Sent after the first verdict, it may show ranks Aerie itself was stopping: not used.
    late = {**beat, "t": T0 + 14}
    assert blame_attempt(*_case([peer], HANG, summaries={"algo-1": CPU, "algo-2": late}))[0] == []
    # Sent before the stall began, it shows the node before it: not used either.
    early = {**beat, "t": T0 - 1, "last_step": 10, "last_step_t": T0 - 1.2}
    assert blame_attempt(*_case([peer], HANG, summaries={"algo-1": CPU, "algo-2": early}))[0] == []


def test_a_rule_that_picks_every_node_picks_none():
    both = [_hang("algo-1", 11, T0, stopped=[0]), _hang("algo-2", 11, T0, stopped=[2])]
    blames, why = blame_attempt(*_case(both, HANG))
    assert blames == [] and "no node singled out" in why


def test_a_one_node_attempt_blames_its_node_and_node_local_causes_name_their_node():
    blames, _ = blame_attempt(*_case([_hang("node1", 5, T0)], {**HANG, "host": "node1"}, nodes=("node1",)))
    assert _hosts(blames) == ["node1"] and blames[0]["rule"] == "only_node"
    lost = {"kind": "node.lost", "host": "algo-2", "message": "no heartbeat for 9s"}
    noise = {"attempt_id": "j-a1", "host": "algo-1", "kind": "silent.hang", "message": "", "t": T0, "evidence": {}}
    blames, _ = blame_attempt(*_case([noise], lost))
    assert _hosts(blames) == ["algo-2"] and blames[0]["rule"] == "reported"
    unnamed = {"kind": "node.lost", "message": "nodes stopped unexpectedly"}
    assert blame_attempt(*_case([], unnamed))[0] == []


def test_a_nic_stall_blames_the_node_whose_link_is_down():
    def nic(host: str, link: str) -> dict:
        ev = {"link": link}
        return {"attempt_id": "j-a1", "host": host, "kind": "silent.nic_stall", "message": "", "t": T0, "evidence": ev}

    reason = {"kind": "silent.nic_stall", "host": "algo-1"}
    blames, _ = blame_attempt(*_case([nic("algo-1", "up"), nic("algo-2", "down")], reason))
    assert _hosts(blames) == ["algo-2"] and blames[0]["rule"] == "link_down"
    assert blame_attempt(*_case([nic("algo-1", "up"), nic("algo-2", "up")], reason))[0] == []
    blames, _ = blame_attempt(*_case([nic("algo-1", "up")], reason))
    assert _hosts(blames) == ["algo-1"] and blames[0]["rule"] == "reported"
