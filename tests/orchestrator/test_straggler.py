"""Straggler detection on synthetic heartbeat streams (issue #19, acceptance 1's rule): a node whose
slowest rank computes far longer than its peers' for `straggler_persist_s` gets one
`node.straggler` verdict naming it, with evidence; noise, short blips, stale heartbeats and
lockstep step times do not. Then the controller's two policies on a real store: `report` keeps
the attempt running, `restart` ends it naming the node (chaining then excludes it:
tests/lambdas/test_blame.py covers blaming the node a failure names)."""

from __future__ import annotations

import random
import time

from aerie_contracts.failures import FailureKind
from aerie_contracts.health import HealthSettings
from orchestrator.backends.base import Backend, NodeStatus, PollResult
from orchestrator.controller import Controller
from orchestrator.settings import Settings
from orchestrator.store import Database, repo
from orchestrator.straggler import StragglerTracker, nic_outliers, outliers

CFG = HealthSettings()
T0 = 10_000.0


def beat(t: float, compute: dict[str, float], step_p50: float = 0.6, nic_bps: float = 5e6) -> dict:
    """One node's heartbeat summary as the agent sends it (agent.monitor.Monitor.summary)."""
    slowest = max(compute, key=compute.get)
    return {
        "t": t,
        "step_time_p50": step_p50,
        "nics": [{"name": "eth0", "rx_bps": nic_bps / 2, "tx_bps": nic_bps / 2}],
        "ranks": {r: {"compute_p50": c, "wait_p50": step_p50 - c, "n": 10} for r, c in compute.items()},
        "compute_p50": compute[slowest],
        "slowest_rank": slowest,
    }


def run(stream, cfg: HealthSettings = CFG, every: float = 5.0):
    """Feed `stream(t) -> {host: summary}` every `every` seconds for its duration; the findings
    with the second they were made."""
    tracker, out = StragglerTracker(), []
    t = T0
    while (beats := stream(t)) is not None:
        out += [(t - T0, f) for f in tracker.observe("att-1", beats, cfg, t)]
        t += every
    return out


def test_a_slow_rank_on_node_b_is_named_after_the_persistence_window():
    """Node B's rank 3 sleeps 0.3 s a step: every step takes 0.6 s everywhere (lockstep), but B's
    rank 3 computes 0.55 s while everyone else computes 0.25 s and waits the rest."""

    def stream(t):
        if t - T0 > 120:
            return None
        slow = t - T0 >= 20
        return {
            "algo-1": beat(t, {"0": 0.25, "1": 0.24}),
            "algo-2": beat(t, {"2": 0.26, "3": 0.55 if slow else 0.25}),
        }

    found = run(stream)
    assert len(found) == 1  # one verdict per node and attempt
    at, f = found[0]
    assert f.kind == FailureKind.NODE_STRAGGLER and f.host == "algo-2" and f.signal == "compute"
    assert 20 + CFG.straggler_persist_s <= at <= 20 + CFG.straggler_persist_s + 5
    ev = f.evidence
    assert ev["slowest_rank"] == "3" and ev["value"] == 0.55 and ev["peers_median"] == 0.25
    assert ev["node_step_p50"] == ev["fleet_step_p50"] == 0.6  # lockstep: step times say nothing
    assert ev["held_s"] >= CFG.straggler_persist_s and "rank 3" in f.message and "algo-2" in f.message


def test_noise_blips_and_stale_heartbeats_raise_nothing():
    rng = random.Random(7)

    def noisy(t):  # 4 nodes, +-30 % jitter on a shared 2-core host, ten minutes
        if t - T0 > 600:
            return None
        return {f"algo-{i}": beat(t, {"0": 0.25 * rng.uniform(0.7, 1.3)}) for i in range(1, 5)}

    assert run(noisy) == []

    def blip(t):  # algo-2 slow for 20 s (a checkpoint copy, a GC pause), twice
        if t - T0 > 300:
            return None
        slow = 50 <= t - T0 < 70 or 150 <= t - T0 < 170
        return {"algo-1": beat(t, {"0": 0.25}), "algo-2": beat(t, {"0": 0.9 if slow else 0.25})}

    assert run(blip) == []

    def stale(t):  # algo-2's last heartbeat is old (node.lost's business, not a straggler)
        if t - T0 > 200:
            return None
        return {"algo-1": beat(t, {"0": 0.25}), "algo-2": beat(T0, {"0": 0.9})}

    assert run(stale) == []


def test_the_robust_rule_needs_a_real_gap():
    assert outliers({"a": 0.25, "b": 0.3}, CFG) == {}  # 20 % slower: within 1 + z x rel
    assert set(outliers({"a": 0.25, "b": 0.5}, CFG)) == {"b"}
    assert outliers({"a": 0.01, "b": 0.04}, CFG) == {}  # tiny steps: under straggler_min_s
    fleet = {f"n{i}": 0.25 + 0.01 * i for i in range(8)} | {"bad": 0.50, "ok": 0.38}  # 1.6x the median is the line
    assert set(outliers(fleet, CFG)) == {"bad"}
    # NIC rates: only with a fleet to compare against, and only a collapse.
    assert nic_outliers({"a": 1e7, "b": 1e5}, CFG) == {}
    assert set(nic_outliers({"a": 1e7, "b": 1.1e7, "c": 1e6}, CFG)) == {"c"}
    assert nic_outliers({"a": 1e3, "b": 1e3, "c": 1e1}, CFG) == {}  # too quiet to judge


def test_a_throttled_nic_in_a_fleet_is_a_nic_straggler():
    def stream(t):
        if t - T0 > 60:
            return None
        return {f"algo-{i}": beat(t, {"0": 0.25}, nic_bps=1e6 if i == 3 else 2e7) for i in range(1, 5)}

    ((_at, f),) = run(stream)
    assert f.host == "algo-3" and f.signal == "nic"


# ----------------------------------------------------------------------------- controller


class Running(Backend):
    """A backend whose attempt keeps running (what the controller's calls reach is recorded)."""

    name = "local"

    def __init__(self):
        self.calls = []

    def launch(self, request):
        raise AssertionError("nothing to launch")

    def poll(self, handle):
        return PollResult("Running", (NodeStatus("algo-1", "Running"), NodeStatus("algo-2", "Running")))

    def fence(self, handle, hosts):
        self.calls.append(("fence", hosts))

    def stop(self, handle):
        self.calls.append(("stop",))

    def logs(self, handle, offsets=None, max_bytes=1 << 20):
        return {}


def _straggling_attempt(db: Database, policy: str) -> str:
    health = {"heartbeat_s": 5, "straggler": policy, "straggler_persist_s": 0}
    with db.session() as s:
        job = repo.create_job(s, {"name": "j", "backend": "local", "health": health}, "default")
        repo.set_job_state(s, job, "InProgress")
        attempt = repo.create_attempt(s, job, 1)
        repo.set_attempt_state(s, attempt, "Running")
        attempt.handle = {"root": "/nowhere", "hosts": ["algo-1", "algo-2"]}
        now = time.time()
        repo.record_heartbeat(s, attempt, "algo-1", beat(now, {"0": 0.25, "1": 0.25})).last_heartbeat_at = now
        repo.record_heartbeat(s, attempt, "algo-2", beat(now, {"2": 0.25, "3": 0.6})).last_heartbeat_at = now
        return attempt.id


def test_policy_report_records_a_verdict_and_keeps_the_job_running(aerie_home):
    db = Database(Settings().db_url)
    attempt_id = _straggling_attempt(db, "report")
    backend = Running()
    controller = Controller(db, Settings(), {"local": backend})
    controller.reconcile_once()
    controller.reconcile_once()  # once per node and attempt
    with db.session() as s:
        attempt = repo.get_attempt(s, attempt_id)
        verdicts = repo.verdicts_of(s, [attempt_id])
        assert attempt.state == "Running" and backend.calls == []
        assert [(v.kind, v.host) for v in verdicts] == [("node.straggler", "algo-2")]
        assert verdicts[0].evidence["slowest_rank"] == "3"
    db.dispose()


def test_policy_restart_ends_the_attempt_naming_the_node(aerie_home):
    db = Database(Settings().db_url)
    attempt_id = _straggling_attempt(db, "restart")
    backend = Running()
    Controller(db, Settings(), {"local": backend}).reconcile_once()
    with db.session() as s:
        attempt = repo.get_attempt(s, attempt_id)
        assert attempt.state == "Failed" and ("stop",) in backend.calls
        assert attempt.reason["kind"] == "node.straggler" and attempt.reason["host"] == "algo-2"
    db.dispose()
