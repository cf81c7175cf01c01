"""Record the traces under tests/data/traces/ from real processes through the real probes.

    .venv/bin/python tests/agent/record_traces.py            # every scenario (~12 min)
    .venv/bin/python tests/agent/record_traces.py sigstop    # one

Each scenario starts 2 fake ranks (``fake_rank.py``: CPU burn + TCP all-reduce + metrics
stream), runs the agent's :class:`Monitor` at 1 s, injects its fault, and writes a JSONL trace:
a header ``{"trace", "expect", "health", "started_at", ...}`` and one ``Monitor.sample`` per
tick. The NIC scenarios put each rank in its own network namespace joined by a veth pair
(root; what the local backend's ``--netns`` does) so the fault is real on the watched link.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from agent.monitor import Monitor  # noqa: E402

TRACES = REPO / "tests" / "data" / "traces"
FAKE_RANK = Path(__file__).with_name("fake_rank.py")
# Tighter than the defaults so traces stay short; the tests replay clean traces with both.
TRACE_HEALTH = {"startup_grace_s": 15, "hang_floor_s": 15, "gpu_idle_s": 10, "nic_window_s": 10, "nic_baseline_s": 60}
COMMON = ["--compute-s", "0.15", "--wait-s", "0.25", "--bytes", str(1 << 20), "--start-delay", "2"]
NS_A, NS_B, VETH_A, VETH_B = "aerie-trace-a", "aerie-trace-b", "aetrace-a", "aetrace-b"
ADDR_A = "10.213.77.1"
# Both ranks of the hiccup scenario share these; rank 1 adds the hiccup.
SLOW_CKPT_EVAL = [
    *("--start-delay", "5", "--slow-first", "4,2,1", "--ckpt-every", "40", "--ckpt-s", "22"),
    *("--eval-after", "110", "--eval-s", "20"),
]

SCENARIOS: dict[str, dict] = {
    "clean_ckpt_eval_hiccup": dict(
        expect=[],
        duration=170,
        ranks=[SLOW_CKPT_EVAL, [*SLOW_CKPT_EVAL, "--hiccup-after", "75", "--hiccup-s", "11"]],
        note="slow start-up and first steps, 22 s checkpoints every 40 steps, an 11 s data-loader "
        "hiccup on rank 1 at +75 s, a 20 s eval at +110 s (times after step 1)",
    ),
    "clean_netns_ckpt": dict(
        expect=[],
        duration=130,
        netns=True,
        ranks=[
            ["--ckpt-every", "25", "--ckpt-s", "18"],
            ["--ckpt-every", "25", "--ckpt-s", "18", "--hiccup-after", "50", "--hiccup-s", "8"],
        ],
        note="two nodes across a veth pair: 18 s checkpoints every 25 steps (the link goes quiet), "
        "an 8 s data-loader hiccup on node B at +50 s",
    ),
    "sigstop": dict(
        expect=["silent.hang"],
        duration=90,
        ranks=[[], []],
        stop_rank_at=(1, 35),
        note="rank 1 SIGSTOPped at +35 s; rank 0 blocks in the all-reduce",
    ),
    "busy_spin": dict(
        expect=["silent.hang"],
        duration=90,
        ranks=[[], ["--spin-after", "25"]],
        note="rank 1 spins at full CPU from step-1+25 s and never finishes the step",
    ),
    "nan_loss": dict(
        expect=["loss.nan"],
        duration=60,
        ranks=[["--nan-after", "25"], []],
        note="rank 0 logs NaN loss from step-1+25 s",
    ),
    "loss_spike": dict(
        expect=["loss.spike"],
        duration=90,
        ranks=[["--spike-after", "40"], ["--spike-after", "40"]],
        note="loss x4 from step-1+40 s on both ranks",
    ),
    "gpu_idle": dict(
        expect=["silent.gpu_idle"],
        duration=70,
        ranks=[[], ["--idle-after", "20"]],
        note="rank 1 stops computing at step-1+20 s but keeps stepping (a wasted device)",
    ),
    "nic_link_down": dict(
        expect=["silent.nic_stall"],
        duration=80,
        ranks=[[], []],
        netns=True,
        link_down_at=40,
        note="veth of node A set down at +40 s",
    ),
    "nic_throttle": dict(
        expect=["silent.nic_stall"],
        duration=80,
        ranks=[[], []],
        netns=True,
        throttle_at=40,
        note="tbf qdisc at 16 kbit on node A's veth at +40 s",
    ),
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True)


def netns_up() -> None:
    netns_down()
    sh("ip", "netns", "add", NS_A)
    sh("ip", "netns", "add", NS_B)
    sh("ip", "link", "add", VETH_A, "type", "veth", "peer", "name", VETH_B)
    sh("ip", "link", "set", VETH_A, "netns", NS_A)
    sh("ip", "link", "set", VETH_B, "netns", NS_B)
    sh("ip", "-n", NS_A, "addr", "add", f"{ADDR_A}/30", "dev", VETH_A)
    sh("ip", "-n", NS_B, "addr", "add", "10.213.77.2/30", "dev", VETH_B)
    for ns, dev in ((NS_A, VETH_A), (NS_B, VETH_B)):
        sh("ip", "-n", ns, "link", "set", dev, "up")
        sh("ip", "-n", ns, "link", "set", "lo", "up")


def netns_down() -> None:
    for ns in (NS_A, NS_B):
        subprocess.run(["ip", "netns", "del", ns], stderr=subprocess.DEVNULL)


def compact(sample: dict) -> dict:
    """Rounded numbers and only the metrics keys the detectors read: traces stay < 200 KB."""
    keep = ("t", "rank", "step", "loss", "step_s", "event")
    return {
        "now": round(sample["now"], 3),
        "accel": {k: None if v is None else round(v, 1) for k, v in sample["accel"].items()},
        "nics": {k: {"rx_bps": round(v["rx_bps"]), "tx_bps": round(v["tx_bps"])} for k, v in sample["nics"].items()},
        "nic_state": sample["nic_state"],
        "retrans": sample["retrans"],
        "records": [{k: r[k] for k in keep if r.get(k) is not None} for r in sample["records"]],
        "processes": [
            {
                "rank": p["rank"],
                "pid": p["pid"],
                "state": p["state"],
                "cpu": None if p["cpu"] is None else round(p["cpu"], 1),
            }
            for p in sample["processes"]
        ],
    }


def run_scenario(name: str) -> None:
    sc = SCENARIOS[name]
    root = Path(tempfile.mkdtemp(prefix=f"trace-{name}-"))
    node_dir, metrics = root / "agent", root / "output" / "metrics"
    netns = sc.get("netns", False)
    addr, port = (ADDR_A, 29500) if netns else ("127.0.0.1", free_port())
    started = time.time()
    procs = []
    for rank, extra in enumerate(sc["ranks"]):
        cmd = [
            sys.executable,
            str(FAKE_RANK),
            "--rank",
            str(rank),
            "--world",
            str(len(sc["ranks"])),
            "--metrics",
            str(metrics),
            "--pid-dir",
            str(node_dir / "ranks"),
            "--addr",
            addr,
            "--port",
            str(port),
            *COMMON,
            *extra,
        ]
        if netns and rank > 0:
            cmd = ["ip", "netns", "exec", NS_B, *cmd]
        procs.append(subprocess.Popen(cmd))
        time.sleep(0.2)
    mon = Monitor(
        node_dir=node_dir,
        metrics_dir=metrics,
        health=TRACE_HEALTH,
        accelerator="cpu",
        interfaces=[VETH_A] if netns else ["lo"],
        started_at=started,
    )
    header = {
        "trace": name,
        "expect": sc["expect"],
        "health": TRACE_HEALTH,
        "started_at": round(started, 3),
        "note": sc["note"],
        "interfaces": mon.nic.interfaces,
        "recorded": time.strftime("%Y-%m-%d"),
    }
    lines, fired_at, injected = [json.dumps(header)], None, False
    next_t = time.time() + 1.0
    while time.time() - started < sc["duration"]:
        time.sleep(max(0.0, next_t - time.time()))
        next_t += 1.0
        verdicts = mon.tick()
        lines.append(json.dumps(compact(mon.last_sample)))
        elapsed = time.time() - started
        for v in verdicts:
            print(f"[{name}] +{elapsed:.1f}s {v.kind}: {v.message}", flush=True)
            fired_at = fired_at or elapsed
        if not injected:
            if "stop_rank_at" in sc and elapsed >= sc["stop_rank_at"][1]:
                os.kill(int((node_dir / "ranks" / f"rank-{sc['stop_rank_at'][0]}.pid").read_text()), signal.SIGSTOP)
                injected = True
            if "link_down_at" in sc and elapsed >= sc["link_down_at"]:
                sh("ip", "link", "set", VETH_A, "down")  # we run inside NS_A
                injected = True
            if "throttle_at" in sc and elapsed >= sc["throttle_at"]:
                sh(
                    "tc",
                    "qdisc",
                    "add",
                    "dev",
                    VETH_A,
                    "root",
                    "tbf",
                    "rate",
                    "16kbit",
                    "burst",
                    "1600",
                    "limit",
                    "3000",
                )
                injected = True
        if fired_at is not None and elapsed - fired_at > 4:
            break
    for p in procs:  # CONT so a stopped rank does not linger in the process table
        for sig in (signal.SIGCONT, signal.SIGKILL):
            try:
                os.kill(p.pid, sig)
            except ProcessLookupError:
                pass
    pids = [int(f.read_text()) for f in (node_dir / "ranks").glob("rank-*.pid")]
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for p in procs:
        p.wait()
    out = TRACES / f"{name}.jsonl"
    out.write_text("\n".join(lines) + "\n")
    print(f"[{name}] wrote {out} ({out.stat().st_size // 1024} KB, {len(lines) - 1} ticks)", flush=True)


def main() -> None:
    TRACES.mkdir(parents=True, exist_ok=True)
    names = sys.argv[1:] or list(SCENARIOS)
    if os.environ.get("AERIE_TRACE_IN_NS"):
        run_scenario(names[0])
        return
    for name in names:
        if SCENARIOS[name].get("netns"):
            netns_up()
            try:
                subprocess.run(
                    ["ip", "netns", "exec", NS_A, sys.executable, __file__, name],
                    check=True,
                    env={**os.environ, "AERIE_TRACE_IN_NS": "1"},
                )
            finally:
                netns_down()
        else:
            run_scenario(name)


if __name__ == "__main__":
    main()
