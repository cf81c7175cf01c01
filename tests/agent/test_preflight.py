"""Each pre-flight check on its own (agent/preflight/), with real parts: psutil and the real
/dev/shm, the loopback S3 server, the NVML stand-in, and real torch subprocesses for the compute
burn and the gloo collective between two "nodes" of this machine; then the node's gate."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from aerie_contracts import env as E
from aerie_contracts.failures import FailureKind
from aerie_contracts.health import HealthSettings, PreflightSettings
from aerie_contracts.preflight import Check, Decision, Fault, PreflightResult, parse_faults, summary_line
from agent.preflight import Node, run_checks
from agent.preflight import host as host_checks
from agent.preflight import store as store_check
from agent.preflight.gpu import GpuHealth
from agent.preflight.local import free_port, run_nodes
from agent.preflight.node import RESULT_FILE, Gate
from tests.helpers import nvml_standin

FAST = PreflightSettings(enabled=True, burn_s=0.2, collective_mb=2, min_link_gbps=0.05, budget_s=60)


def _by_check(result) -> dict:
    return {c["check"]: c for c in result["checks"]}


# --- settings and faults -------------------------------------------------------------------------


def test_the_spec_s_preflight_section_reaches_the_agent_and_defaults_off():
    assert HealthSettings().preflight.enabled is False
    got = HealthSettings.from_dict({"preflight": {"enabled": True, "min_cpu_gflops": 2, "budget_s": 30}}).preflight
    assert got.enabled and got.min_cpu_gflops == 2.0 and got.budget_s == 30.0 and got.burn_s == 0.5
    assert HealthSettings.from_dict(HealthSettings(preflight=got).to_dict()).preflight == got


def test_faults_name_a_cause_and_optionally_a_host():
    assert parse_faults("slow_compute@algo-2, shm_full", "algo-2") == [Fault.SLOW_COMPUTE, Fault.SHM_FULL]
    assert parse_faults("slow_compute@algo-2,shm_full", "algo-1") == [Fault.SHM_FULL]
    assert parse_faults("", "algo-1") == [] and parse_faults(None, "algo-1") == []
    with pytest.raises(ValueError, match="unknown pre-flight fault 'slow_gpu'"):
        parse_faults("slow_gpu", "algo-1")


# --- host memory and shared memory ---------------------------------------------------------------


def test_host_memory_is_held_to_its_floor():
    ok = host_checks.host_memory(PreflightSettings(min_host_mem_mb=1))
    assert ok["passed"] and ok["value"] > 1 and ok["unit"] == "MiB" and ok["threshold"] == 1
    bad = host_checks.host_memory(PreflightSettings(min_host_mem_mb=1e12))
    assert not bad["passed"] and "< 1e+12" in bad["reason"]


def test_shm_free_space_against_the_floor_the_tier_s_snapshots_and_an_injected_full_shm(tmp_path):
    area = tmp_path / "memckpt"
    env = {E.MEMORY_CHECKPOINT_DIR: str(area)}  # not made yet: its nearest existing parent is measured
    ok = host_checks.shm(PreflightSettings(min_shm_free_mb=1), env, procs=2, faults=[])
    assert ok["passed"] and ok["details"]["area"] == str(area)
    # With the tier on, what an earlier attempt's snapshots show it needs (factor x newest x ranks).
    (area / "job" / "local").mkdir(parents=True)
    (area / "job" / "local" / "rank_0.step_4.snap").write_bytes(b"\0" * (1 << 20))
    tier = {**env, E.MEMORY_CHECKPOINT_EVERY: "auto"}
    huge = PreflightSettings(min_shm_free_mb=1, shm_snapshot_factor=1e9)
    bad = host_checks.shm(huge, tier, procs=2, faults=[])
    assert not bad["passed"] and bad["threshold"] == pytest.approx(2e9) and bad["details"]["newest_snapshot_mb"] == 1
    assert host_checks.shm(huge, env, procs=2, faults=[])["passed"]  # tier off: the floor only
    full = host_checks.shm(PreflightSettings(min_shm_free_mb=1), env, procs=1, faults=[Fault.SHM_FULL])
    assert not full["passed"] and full["value"] == 0 and "injected: shm_full" in full["reason"]


# --- the checkpoint store --------------------------------------------------------------------------


def test_the_store_probe_puts_heads_and_deletes_under_the_job_s_prefix(s3_env, s3_bucket):
    import boto3

    env = {**s3_env, E.CHECKPOINT_URI: f"s3://{s3_bucket}/ckpt/job-1"}
    ok = store_check.store(env, "algo-1", "att-1", 5.0, [])
    assert ok["passed"] and ok["unit"] == "s" and "PUT+HEAD+DELETE" in ok["reason"]
    s3 = boto3.client("s3", endpoint_url=s3_env["AWS_ENDPOINT_URL"])
    assert s3.list_objects_v2(Bucket=s3_bucket).get("KeyCount", 0) == 0  # the probe is gone
    t0 = time.monotonic()
    bad = store_check.store(env, "algo-1", "att-1", 1.0, [Fault.STORE_UNREACHABLE])
    assert not bad["passed"] and bad["reason"].startswith("PUT s3://") and "store_unreachable" in bad["reason"]
    assert time.monotonic() - t0 < 30
    missing = store_check.store({**env, E.CHECKPOINT_URI: f"s3://{s3_bucket}-nope/x"}, "algo-1", "a", 5.0, [])
    assert not missing["passed"] and "NoSuchBucket" in missing["reason"]
    assert store_check.store({}, "algo-1", "a", 5.0, [])["skipped"]


# --- GPUs (NVML stand-in) -----------------------------------------------------------------------------


def test_gpu_health_skips_without_nvml_and_flags_ecc_retired_pages_slowdown_and_xids():
    class NoNvml:
        def nvmlInit(self):
            raise RuntimeError("NVML Shared Library Not Found")

    none = GpuHealth({}, NoNvml()).finish(FAST)
    assert none["passed"] and none["skipped"] and "NVML Shared Library Not Found" in none["reason"]
    gpus = nvml_standin.eight_gpus([0.0] * 8)
    healthy = GpuHealth({"CUDA_VISIBLE_DEVICES": "0,1"}, nvml_standin.module(gpus)).finish(FAST)
    assert healthy["passed"] and sorted(healthy["details"]["gpus"]) == ["0", "1"]
    # What an idle H100 answered on the device machine: ECC 0, retired pages NotSupported (it
    # remaps rows instead), throttle reasons 0x1 (GPU idle), SM clock 345 of 1980 MHz: healthy.
    h100 = nvml_standin.Gpu(uuid="GPU-b3dd9f82", ecc_uncorrected=0, retired_pending=None, throttle_reasons=0x1)
    h100.remap, h100.sm_clock_mhz = (0, 0, False, False), 345
    assert GpuHealth({}, nvml_standin.module([h100])).finish(FAST)["passed"]
    gpus[1].ecc_uncorrected, gpus[2].retired_pending, gpus[3].throttle_reasons = 3, True, 0x40
    gpus[4].remap = (0, 1, True, False)
    health = GpuHealth({}, nvml_standin.module(gpus, xids=[(5, 79)]))
    bad = health.finish(FAST)
    assert not bad["passed"] and bad["value"] == 5
    for words in ("GPU 1: 3 uncorrected ECC", "GPU 2: retired pages", "GPU 3: hardware clock", "GPU 5: XID 79"):
        assert words in bad["reason"]
    assert "GPU 4: row remapping pending" in bad["reason"]


# --- compute burn and collective (torch subprocesses) ----------------------------------------------


def test_one_node_burns_the_cpu_and_skips_the_collective_and_a_slow_accelerator_fails(tmp_path):
    env = {E.MEMORY_CHECKPOINT_DIR: str(tmp_path)}
    node = Node("algo-1", ("algo-1",), "127.0.0.1", free_port(), "att-1")
    res = run_checks(FAST, node, env)
    checks = _by_check(res)
    assert res["passed"], summary_line(res)
    assert checks[Check.COMPUTE]["unit"] == "GFLOP/s" and checks[Check.COMPUTE]["value"] > FAST.min_cpu_gflops
    assert checks[Check.COLLECTIVE]["skipped"] and checks[Check.STORE]["skipped"]
    assert 0 < res["elapsed_s"] < FAST.budget_s
    print(f"one node's pre-flight: {res['elapsed_s']:.1f}s, {checks[Check.COMPUTE]['value']:.1f} GFLOP/s")
    slow = run_checks(FAST, node, {**env, E.PREFLIGHT_FAULT: "slow_compute@algo-1"})
    c = _by_check(slow)[Check.COMPUTE]
    assert not slow["passed"] and not c["passed"] and c["value"] < FAST.min_cpu_gflops
    assert slow["faults"] == ["slow_compute"]
    assert "FAILED" in summary_line(slow) and "compute:" in summary_line(slow)


def _two_nodes(tmp_path: Path, fault: str = "") -> dict[str, PreflightResult]:
    env = {E.MEMORY_CHECKPOINT_DIR: str(tmp_path), E.PREFLIGHT_FAULT: fault}
    return run_nodes(FAST, ("algo-1", "algo-2"), "att-1", env, timeout_s=120)


def test_two_nodes_all_reduce_and_time_each_link(tmp_path):
    res = _two_nodes(tmp_path)
    for host, r in res.items():
        c = _by_check(r)[Check.COLLECTIVE]
        assert r["passed"] and c["passed"] and not c["skipped"], (host, summary_line(r))
        assert c["details"]["allreduce_busbw_gbps"] > 0 and len(c["details"]["links_gbps"]) == 2
        assert c["details"]["bytes"] == 2 * 1024 * 1024
    links = _by_check(res["algo-1"])[Check.COLLECTIVE]["details"]["links_gbps"]
    print(f"two nodes: {[r['elapsed_s'] for r in res.values()]} s, links {links} Gbit/s")


def test_a_slow_link_names_its_sender_only(tmp_path):
    res = _two_nodes(tmp_path, "slow_link@algo-2")
    slow, peer = _by_check(res["algo-2"])[Check.COLLECTIVE], _by_check(res["algo-1"])[Check.COLLECTIVE]
    assert not res["algo-2"]["passed"] and not slow["passed"] and slow["value"] < FAST.min_link_gbps
    assert "link to algo-1" in slow["reason"]
    assert res["algo-1"]["passed"] and peer["passed"] and peer["value"] > FAST.min_link_gbps


# --- the node's gate ---------------------------------------------------------------------------------


class _Reporter:
    def __init__(self, answers: list[str], enabled: bool = True):
        self.enabled, self.attempt_over = enabled, False
        self.answers, self.posted, self.beats = list(answers), [], []

    def preflight(self, result):
        self.posted.append(result)
        return {"action": self.answers.pop(0), "why": "test"}

    def preflight_decision(self):
        return {"action": self.answers.pop(0) if self.answers else Decision.WAIT, "why": "pre-flight failed on algo-2"}

    def heartbeat(self, summary):
        self.beats.append(summary)


def _gate(tmp_path, reporter, passed: bool) -> Gate:
    node = Node("algo-1", ("algo-1", "algo-2"), "127.0.0.1", 1, "att-1")
    check = {"check": "shm", "passed": passed, "reason": "free 0 MiB < 256"}
    res = {"host": "algo-1", "passed": passed, "checks": [check], "elapsed_s": 0.1, "t": 5.0}
    return Gate(FAST, node, {}, reporter, tmp_path, heartbeat_s=0.05, checks=lambda: (time.sleep(0.2), res)[1])


def test_a_failed_node_ends_with_preflight_failed_naming_itself(tmp_path):
    rep = _Reporter([Decision.ABORT])
    gate = _gate(tmp_path, rep, passed=False)
    assert gate.run() is False
    assert gate.outcome["kind"] == FailureKind.PREFLIGHT_FAILED and gate.outcome["host"] == "algo-1"
    assert "(shm)" in gate.outcome["message"] and gate.outcome["evidence"]["preflight"]["passed"] is False
    assert rep.posted and rep.beats and rep.beats[0]["phase"] == "preflight"  # alive while it checks
    assert (tmp_path / RESULT_FILE).exists()


def test_a_node_that_passed_waits_for_its_peers_then_starts_or_stands_down(tmp_path):
    rep = _Reporter([Decision.WAIT, Decision.WAIT, Decision.START])
    gate = _gate(tmp_path, rep, passed=True)
    assert gate.run() is True and gate.outcome is None
    rep = _Reporter([Decision.WAIT, Decision.ABORT])
    gate = _gate(tmp_path, rep, passed=True)
    assert gate.run() is False
    assert gate.outcome["kind"] == FailureKind.USER_STOP and "algo-2" in gate.outcome["message"]
    alone = _gate(tmp_path, _Reporter([], enabled=False), passed=True)
    assert alone.run() is True  # no control plane: the node decides alone
