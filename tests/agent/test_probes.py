"""Probes against real files, a fake ``/sys`` tree, and real processes."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent.probes import gpu as gpu_mod
from agent.probes.gpu import CpuAcceleratorProbe, NvmlProbe, RankProcesses, make_accelerator_probe
from agent.probes.nic import NicProbe, default_interfaces, interfaces_from_resourceconfig
from agent.probes.progress import ProgressProbe

# ----------------------------------------------------------------------------- progress


def rec(rank, step, **kw):
    return (
        json.dumps(
            {
                "t": 100.0 + step,
                "rank": rank,
                "step": step,
                "loss": 2.0,
                "grad_norm": 1.0,
                "lr": 1e-4,
                "tokens": 10,
                "step_s": 0.5,
                "event": None,
                **kw,
            }
        )
        + "\n"
    )


def test_progress_tails_incrementally_with_partial_lines_and_late_files(tmp_path):
    p = ProgressProbe(tmp_path)
    assert p.sample() == [] and p.last_step() is None  # nothing yet
    f0 = tmp_path / "rank-00000.jsonl"
    line2 = rec(0, 2)
    f0.write_text(rec(0, 1) + line2[:20])  # the trainer is mid-write of step 2
    assert [r["step"] for r in p.sample()] == [1]
    assert p.sample() == []
    with open(f0, "a") as f:
        f.write(line2[20:] + rec(0, 3))
    assert [r["step"] for r in p.sample()] == [2, 3]
    (tmp_path / "rank-00001.jsonl").write_text(rec(1, 1) + rec(1, 2))  # rank 1 appears later
    assert [r["rank"] for r in p.sample()] == [1, 1]
    assert p.last_step() == 2  # the slowest rank's step
    assert p._tails[0].offset == f0.stat().st_size  # remembers where it was


def test_progress_never_rereads_old_bytes(tmp_path, monkeypatch):
    f0 = tmp_path / "rank-00000.jsonl"
    f0.write_text("".join(rec(0, s) for s in range(1, 2001)))
    p = ProgressProbe(tmp_path)
    assert len(p.sample()) == 2000
    reads = []
    real_open = open

    def spy(path, mode="r", *a, **k):
        fh = real_open(path, mode, *a, **k)
        if "rank-" in str(path):
            orig = fh.read
            fh.read = lambda n=-1: reads.append(n) or orig(n)
        return fh

    monkeypatch.setattr("builtins.open", spy)
    with real_open(f0, "a") as f:
        f.write(rec(0, 2001))
    assert [r["step"] for r in p.sample()] == [2001]
    assert reads == [len(rec(0, 2001))]


def test_progress_events_losses_and_bad_lines(tmp_path):
    f = tmp_path / "rank-00000.jsonl"
    f.write_text(rec(0, 1) + rec(0, 1, event="checkpoint_begin", loss=None) + "not json\n")
    p = ProgressProbe(tmp_path)
    p.sample()
    assert p.in_pause("checkpoint") and not p.in_pause("eval") and p.bad_lines == 1
    with open(f, "a") as fh:
        fh.write(
            rec(0, 1, event="checkpoint_end")
            + rec(0, 1, event="checkpoint_committed", uri="s3://b/k")
            + rec(0, 2, event="eval_begin")
            + rec(0, 2, event="eval_end")
            + rec(0, 3, loss="nan")
            + rec(0, 4, loss=float("nan"))
        )
    p.sample()
    assert not p.in_pause("checkpoint") and not p.in_pause("eval")
    assert p.pauses == type(p.pauses)([[101.0, 101.0], [102.0, 102.0]], maxlen=p.pauses.maxlen)
    assert [s[1] for s in p.steps[0]] == [1, 3, 4]  # events are not steps
    assert math.isnan(p.steps[0][1][2]) and math.isnan(p.steps[0][2][2])
    assert p.last_loss() is None  # the last loss is NaN: not a number to show


def test_progress_restarts_a_truncated_file(tmp_path):
    f = tmp_path / "rank-00000.jsonl"
    f.write_text(rec(0, 1) + rec(0, 2))
    p = ProgressProbe(tmp_path)
    p.sample()
    f.write_text(rec(0, 1))  # a new attempt recreated the stream
    assert [r["step"] for r in p.sample()] == [1]


# ----------------------------------------------------------------------------- nic


def fake_sys(root: Path, ifaces: dict[str, tuple[int, int, str, int]]) -> None:
    for name, (rx, tx, state, flags) in ifaces.items():
        st = root / "class" / "net" / name / "statistics"
        st.mkdir(parents=True, exist_ok=True)
        (st / "rx_bytes").write_text(f"{rx}\n")
        (st / "tx_bytes").write_text(f"{tx}\n")
        (st.parent / "operstate").write_text(state + "\n")
        (st.parent / "flags").write_text(hex(flags) + "\n")


def fake_snmp(root: Path, retrans: int) -> None:
    (root / "net").mkdir(parents=True, exist_ok=True)
    (root / "net" / "snmp").write_text(
        f"Ip: Forwarding DefaultTTL\nIp: 1 64\nTcp: RtoAlgorithm RtoMin RetransSegs InErrs\nTcp: 1 200 {retrans} 0\n"
    )


def test_default_interfaces_skip_loopback_and_down(tmp_path):
    fake_sys(
        tmp_path,
        {
            "lo": (0, 0, "unknown", 0x9),
            "eth0": (0, 0, "up", 0x1003),
            "eth1": (0, 0, "down", 0x1002),
            "veth0": (0, 0, "unknown", 0x1003),
        },
    )
    assert default_interfaces(tmp_path) == ["eth0", "veth0"]


def test_nic_rates_state_and_retrans(tmp_path):
    sysr, procr = tmp_path / "sys", tmp_path / "proc"
    fake_sys(sysr, {"eth0": (1000, 5000, "up", 0x1003), "lo": (0, 0, "unknown", 0x9)})
    fake_snmp(procr, 7)
    probe = NicProbe(["eth0", "lo"], sys_root=sysr, proc_root=procr)
    assert probe.sample(10.0) == {}  # first sample primes the counters
    fake_sys(sysr, {"eth0": (3000, 5000 + 4000, "down", 0x1002), "lo": (100, 100, "unknown", 0x9)})
    fake_snmp(procr, 9)
    rates = probe.sample(12.0)
    assert rates["eth0"] == {"rx_bps": 1000.0, "tx_bps": 2000.0}
    assert rates["lo"] == {"rx_bps": 50.0, "tx_bps": 50.0}
    assert probe.state == {"eth0": "down", "lo": "unknown"}
    assert probe.retrans.last() == (12.0, 9) and len(probe.rings["eth0"]) == 1
    fake_sys(sysr, {"eth0": (0, 0, "up", 0x1003)})  # counters reset (driver reload): no negative rate
    assert probe.sample(13.0)["eth0"] == {"rx_bps": 0.0, "tx_bps": 0.0}


def test_unknown_interface_names_fall_back_to_the_up_ones(tmp_path):
    fake_sys(tmp_path, {"lo": (0, 0, "unknown", 0x9), "eth0": (0, 0, "up", 0x1003)})
    probe = NicProbe(["ens5"], sys_root=tmp_path, proc_root=tmp_path)
    assert probe.interfaces == ["eth0"] and probe.missing == ["ens5"]
    assert NicProbe(["lo", "ens5"], sys_root=tmp_path, proc_root=tmp_path).interfaces == ["lo"]


def test_infiniband_port_counters_are_words(tmp_path):
    fake_sys(tmp_path, {"eth0": (0, 0, "up", 0x1003)})
    port = tmp_path / "class" / "infiniband" / "efa_0" / "ports" / "1"
    (port / "counters").mkdir(parents=True)
    (port / "state").write_text("4: ACTIVE\n")
    for n, v in (("port_rcv_data", 100), ("port_xmit_data", 200)):
        (port / "counters" / n).write_text(str(v))
    probe = NicProbe(["eth0"], sys_root=tmp_path, proc_root=tmp_path / "noproc")
    probe.sample(1.0)
    for n, v in (("port_rcv_data", 350), ("port_xmit_data", 200)):
        (port / "counters" / n).write_text(str(v))
    rates = probe.sample(2.0)
    assert rates["efa_0/1"] == {"rx_bps": 1000.0, "tx_bps": 0.0} and probe.state["efa_0/1"] == "up"
    assert probe.retrans.last() is None  # no /proc/net/snmp: no retrans, no crash


def test_real_loopback_counters_move(tmp_path):
    probe = NicProbe(["lo"])
    probe.sample(time.time())
    import socket

    srv = socket.create_server(("127.0.0.1", 0))
    c = socket.create_connection(srv.getsockname())
    s, _ = srv.accept()
    c.sendall(b"x" * 2_000_000)
    got = 0
    while got < 2_000_000:
        got += len(s.recv(1 << 20))
    time.sleep(0.05)
    rates = probe.sample(time.time())
    assert rates["lo"]["rx_bps"] > 0 and rates["lo"]["tx_bps"] > 0
    for x in (c, s, srv):
        x.close()


def test_interfaces_from_resourceconfig(tmp_path):
    rc = tmp_path / "resourceconfig.json"
    rc.write_text(json.dumps({"current_host": "algo-1", "hosts": ["algo-1"], "network_interface_name": "eth0"}))
    assert interfaces_from_resourceconfig(rc) == ["eth0"]
    rc.write_text(json.dumps({"network_interface_name": "eth0, efa0"}))
    assert interfaces_from_resourceconfig(rc) == ["eth0", "efa0"]
    rc.write_text(json.dumps({"hosts": []}))
    assert interfaces_from_resourceconfig(rc) is None
    assert interfaces_from_resourceconfig(tmp_path / "missing.json") is None


# ----------------------------------------------------------------------------- accelerators


SPIN = "import time\nwhile True: pass"
SLEEP = "import time\ntime.sleep(600)"


@pytest.fixture
def ranks(tmp_path):
    procs = []

    def start(rank: int, code: str) -> subprocess.Popen:
        p = subprocess.Popen([sys.executable, "-c", code])
        procs.append(p)
        (tmp_path / f"rank-{rank}.pid").write_text(str(p.pid))
        return p

    yield start
    for p in procs:
        p.kill()
        p.wait()


def test_cpu_accelerator_probe_sees_busy_idle_stopped_and_gone(tmp_path, ranks):
    busy, _idle = ranks(0, SPIN), ranks(1, SLEEP)
    stopped = ranks(2, SPIN)
    (tmp_path / "rank-3.pid").write_text("999999999")  # a rank that already exited
    (tmp_path / "rank-4.pid").write_text("")  # being written
    rp = RankProcesses(tmp_path)
    probe = CpuAcceleratorProbe(rp)
    first = probe.sample(time.time(), rp.sample(time.time()))
    # first sight of each live process: no interval yet; the exited one is an idle device
    assert first == [{"index": 3, "util": 0.0, "mem_used": None, "pid": 999999999}]
    time.sleep(0.3)
    os.kill(stopped.pid, signal.SIGSTOP)
    time.sleep(0.1)
    import psutil

    spinner = psutil.Process(busy.pid)
    t0 = time.time()
    rp.sample(t0)
    c0 = sum(spinner.cpu_times()[:2])
    time.sleep(0.8)
    c1 = sum(spinner.cpu_times()[:2])
    t1 = time.time()
    procs = {p["rank"]: p for p in rp.sample(t1)}
    assert procs[1]["state"] == "sleeping" and procs[2]["state"] == "stopped" and procs[3]["state"] == "gone"
    assert 4 not in procs
    # spinning: whatever share of a core the (shared, busy) host gives it, the probe reports it
    assert procs[0]["cpu"] > 5
    assert procs[0]["cpu"] == pytest.approx(100 * (c1 - c0) / (t1 - t0), abs=15)
    assert procs[1]["cpu"] < 5 and procs[2]["cpu"] < 5
    samples = {s["index"]: s for s in probe.sample(time.time(), list(procs.values()))}
    assert samples[0]["util"] == min(100.0, procs[0]["cpu"]) and samples[0]["mem_used"] > 0
    assert set(probe.rings) == {0, 1, 2, 3}
    os.kill(stopped.pid, signal.SIGCONT)


def test_rank_processes_follow_a_new_pid(tmp_path, ranks):
    rp = RankProcesses(tmp_path)
    a = ranks(0, SLEEP)
    assert rp.sample(1.0)[0]["pid"] == a.pid
    b = ranks(0, SLEEP)  # restarted rank
    again = rp.sample(2.0)[0]
    assert again["pid"] == b.pid and again["cpu"] is None and again["state"] in ("sleeping", "running")


def test_accelerator_probe_falls_back_to_cpu_without_nvml(tmp_path, monkeypatch):
    def no_driver(*a, **k):
        raise RuntimeError("NVML Shared Library Not Found")

    monkeypatch.setattr(gpu_mod.NvmlProbe, "__init__", no_driver)
    assert isinstance(make_accelerator_probe(RankProcesses(tmp_path)), CpuAcceleratorProbe)


def test_nvml_probe_sample_shape_with_a_stub_library(monkeypatch):
    """The NVML path, against a stand-in for the pynvml module (the real one needs a GPU)."""
    from tests.helpers.nvml_standin import Gpu, module

    gpus = [Gpu("GPU-aaaa", util=97, mem_used=123), Gpu("GPU-bbbb", util=0, mem_used=123)]
    monkeypatch.setitem(sys.modules, "pynvml", module(gpus, xids=[(1, 79)]))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("NVIDIA_VISIBLE_DEVICES", raising=False)
    probe = NvmlProbe()
    s = probe.sample(1.0)
    assert [x["util"] for x in s] == [97.0, 0.0]
    assert s[1] == {
        "index": 1,
        "util": 0.0,
        "mem_used": 123,
        "power_w": 70.0,
        "temp_c": 40,
        "ecc_uncorrected": None,
        "xid_count": 1,
        "last_xid": 79,
    }
    assert len(probe.rings[0]) == 1
