"""Projected goodput of a 4,000-GPU / 500-node run over 30 days, three policies side by side (issue 24).

A seeded discrete-event simulation (devtools/goodput_simulate.py) with Llama 3's failure rate
and mix: 419 unexpected interruptions in 54 days on 16,384 GPUs (Meta, "The Llama 3 Herd of
Models", 2024, table 5), scaled per GPU, causes drawn with their published shares; 4 TB
checkpoints. Policies:

  (a) baseline (the seed): no agent, a failure is found by the 30-minute collective timeout, full
      relaunch, synchronous S3 checkpoints every 2 h (torch.save + one-stream upload), one-stream
      restore;
  (b) Aerie relaunch from S3: detection by the agent (a crash at the next heartbeat, a hang after
      the hang floor), full relaunch, asynchronous S3 saves (the step loop waits for the snapshot
      only) at the Young–Daly interval, parallel ranged restore;
  (c) Aerie in place: memory checkpoints (Young–Daly on the snapshot stall) replicated to a peer,
      hot spares for hardware faults, workers restarted in place for software faults, restore
      from memory; S3 every 2 h asynchronously. Its in-place restart and the agent's detection
      delays are MEASURED in this run (the recovery harness, devtools/harness/recovery.py: one
      job of the tiny trainer on 2 local nodes x 2 ranks, a rank killed, stopped and spinning,
      each restarted in place from a memory checkpoint); the spare's swap stays assumed (hot spares
      are not measured yet), as does SageMaker's relaunch; the JSON says which.

Measured in this run (unless --no-measure), each in a few seconds: restore throughput of the
project's parallel ranged reader (aerie_s3, `--connections` GETs) and of one stream through the
throttling proxy (devtools/s3proxy.py) in front of the loopback S3 server, as an efficiency
against the per-connection cap, scaled to S3's ~85 MB/s per connection; the snapshot stall of an
asynchronous save as host memory copy throughput (what the step loop waits for; a GPU's
device-to-host copy is faster, so this is conservative); and (about 90 s, `--no-recovery` skips
it) the recovery harness's in-place restarts, as above. Everything else is a stated parameter.

Prints ONE JSON line (every parameter with `value`, `unit`, `source`: measured | assumed |
published | spec default | derived) and writes docs/img/goodput.png.

    .venv/bin/python bench/goodput_at_scale.py [--days 30] [--replications 20] [--seed 24] [--no-measure]
                                               [--no-recovery]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from aerie_contracts import env

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from aerie_contracts.failures import FailureKind  # noqa: E402
from aerie_contracts.goodput import LABELS, Category  # noqa: E402
from aerie_contracts.health import HealthSettings  # noqa: E402
from aerie_contracts.states import JobState  # noqa: E402
from devtools import goodput_simulate as simulate  # noqa: E402
from orchestrator.goodput import advice  # noqa: E402

MB = 1e6
GPUS, NODES = 4000, 500
CHECKPOINT_BYTES = 4e12
# Meta, Llama 3 (2024), table 5: root causes of 419 unexpected interruptions in 54 days, 16,384 GPUs.
LLAMA3 = {"interruptions": 419, "days": 54, "gpus": 16384}
CAUSES = [
    ("GPU faulty", 30.1, "node"),
    ("GPU HBM3 memory", 17.2, "node"),
    ("software bug", 12.9, "software"),
    ("network switch/cable", 8.4, "node"),
    ("host maintenance", 7.6, "node"),
    ("GPU SRAM memory", 4.5, "node"),
    ("GPU system processor", 4.1, "node"),
    ("NIC", 1.7, "node"),
    ("NCCL watchdog timeouts", 1.7, "hang"),
    ("silent data corruption", 1.4, "software"),
    ("GPU thermal interface + sensor", 0.6, "node"),
    ("SSD", 0.4, "node"),
    ("power supply", 0.4, "node"),
    ("server chassis", 0.3, "node"),
    ("IO expansion board", 0.3, "node"),
    ("dependency", 0.3, "software"),
    ("CPU", 0.2, "node"),
    ("system memory", 0.2, "node"),
]
# Which faults stop the ranks outright (a dead process: seen at the next heartbeat) and which leave
# them hanging in a collective (seen by the hang detector). A faulty GPU, its memory and the
# switches mostly hang the collective; a software bug or a dependency mostly crashes.
HANGS = {"network switch/cable", "NIC", "NCCL watchdog timeouts", "GPU HBM3 memory", "GPU faulty", "GPU SRAM memory"}


def param(value, unit: str, source: str, note: str = "") -> dict:
    out = {"value": value, "unit": unit, "source": source}
    if note:
        out["note"] = note
    return out


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --- measurements (each a few seconds) --------------------------------------------------------------


def measure_restore(connections: int, size_mb: int) -> dict:
    """Efficiency of the parallel ranged reader and of one stream, each against its connections'
    cap, through the throttling proxy in front of loopback S3."""
    from aerie_s3 import ranged
    from aerie_s3.settings import S3Settings
    from devtools.devstack import S3Server
    from devtools.s3proxy import ProxyProcess

    work = Path(tempfile.mkdtemp(prefix="aerie-goodput-"))
    server = S3Server.start(log_path=work / "moto.log")
    proxy = None
    saved = dict(os.environ)
    try:
        os.environ.update(server.env())  # the CRT client reads its credentials from the environment
        client = server.client()
        size = size_mb * (1 << 20)
        client.put_object(Bucket=server.bucket, Key="probe", Body=os.urandom(size))
        uri = f"s3://{server.bucket}/probe"
        direct = S3Settings.from_env(server.env())
        ranged.parallel_get(uri, connections=connections, part_size=size // connections, settings=direct)
        t0 = time.perf_counter()
        ranged.parallel_get(uri, connections=connections, part_size=size // connections, settings=direct)
        link = size / (time.perf_counter() - t0)
        cap = 0.5 * link / connections  # scaled so that connections x cap stays within what moto serves
        proxy = ProxyProcess("127.0.0.1", server.port, cap, str(work / "proxy.json"))
        capped = S3Settings.from_env({**server.env(), env.S3_ENDPOINT: proxy.endpoint_url})
        t0 = time.perf_counter()
        ranged.parallel_get(uri, connections=connections, part_size=size // connections, settings=capped)
        parallel = size / (time.perf_counter() - t0)
        single_size = max(1 << 20, size // connections)
        client.put_object(Bucket=server.bucket, Key="probe-1", Body=os.urandom(single_size))
        t0 = time.perf_counter()
        ranged.parallel_get(f"s3://{server.bucket}/probe-1", connections=1, part_size=single_size, settings=capped)
        single = single_size / (time.perf_counter() - t0)
        return {
            "parallel_efficiency": parallel / (connections * cap),
            "single_stream_efficiency": single / cap,
            "loopback_cap_MBps": cap / MB,
            "loopback_parallel_MBps": parallel / MB,
            "loopback_single_MBps": single / MB,
        }
    finally:
        if proxy is not None:
            proxy.proc.kill()
            proxy.proc.wait()
        server.stop()
        # This server's endpoint must not outlive it: the recovery run's control plane starts its own.
        os.environ.clear()
        os.environ.update(saved)


def measure_snapshot(size_mb: int) -> float:
    """Bytes/s of copying a state into host memory: the synchronous part of an asynchronous save."""
    src = bytearray(os.urandom(1 << 20)) * size_mb
    bytes(src)  # warm the allocator
    best = 0.0
    for _ in range(3):
        t0 = time.perf_counter()
        copy = bytearray(src)
        best = max(best, len(copy) / (time.perf_counter() - t0))
    return best


def measure_recovery() -> dict:
    """The in-place recovery of the tiny trainer's rank faults on this machine (the harness of
    `bench/chaos.py --only recovery`, its `in place + memory` policy): per fault kind, the agent's
    detection delay (last step -> verdict) and the restart (verdict -> the new ranks restoring)."""
    from devtools.harness.control_plane import started_plane
    from devtools.harness.recovery import run_policy

    with started_plane("aerie-goodput-recovery-") as (cp, work):
        run = run_policy(cp, work, "in place + memory", bucket="s3://aerie/goodput-recovery")
    faults = [f for f in run.faults if f.get("mode") == "in_place" and f.get("restart_s") is not None]
    if run.job["state"] != JobState.COMPLETED or not faults:
        raise RuntimeError(f"the recovery run did not give in-place restarts: {run.job['state']}, {run.faults}")
    hangs = [
        f["detect_s"] for f in faults if f.get("reason") == FailureKind.SILENT_HANG and f.get("detect_s") is not None
    ]
    crashes = [
        f["detect_s"] for f in faults if f.get("reason") == FailureKind.EXIT_NONZERO and f.get("detect_s") is not None
    ]
    return {
        "in_place_restart_s": statistics.median(f["restart_s"] + f.get("restore_s", 0.0) for f in faults),
        "hang_detect_s": max(hangs) if hangs else None,
        "crash_detect_s": max(crashes) if crashes else None,
        "faults": faults,
    }


# --- the model --------------------------------------------------------------------------------------


def parameters(args, measured: dict | None, snapshot_Bps: float | None, recovery: dict | None = None) -> dict:
    p: dict[str, dict] = {}
    p["gpus"] = param(GPUS, "GPUs", "assumed", "the seed's scale")
    p["nodes"] = param(NODES, "nodes", "assumed", "8 GPUs per node")
    p["days"] = param(args.days, "days", "assumed")
    p["checkpoint_bytes"] = param(CHECKPOINT_BYTES, "bytes", "assumed", "4 TB (weights + optimizer state)")
    rate = LLAMA3["interruptions"] / (LLAMA3["days"] * 86400 * LLAMA3["gpus"]) * GPUS
    p["failure_rate"] = param(rate * 86400, "failures/day", "published", "Llama 3: 419 in 54 days on 16,384 GPUs")
    p["job_mtbf_s"] = param(1 / rate, "s", "derived")
    p["s3_connection_cap_MBps"] = param(85.0, "MB/s", "published", "S3 per-connection throughput, 80-100 MB/s")
    p["restore_connections"] = param(args.connections, "connections per node", "assumed")
    eff = measured or {"parallel_efficiency": 0.9, "single_stream_efficiency": 0.9}
    src = "measured" if measured else "assumed"
    p["parallel_restore_efficiency"] = param(eff["parallel_efficiency"], "of connections x cap", src)
    p["single_stream_efficiency"] = param(eff["single_stream_efficiency"], "of one connection's cap", src)
    if measured:
        p["loopback"] = param({k: v for k, v in measured.items() if k.startswith("loopback")}, "MB/s", "measured")
    per_node = CHECKPOINT_BYTES / NODES
    cap = 85.0 * MB
    p["bytes_per_node"] = param(per_node, "bytes", "derived")
    p["s3_restore_parallel_s"] = param(
        per_node / (eff["parallel_efficiency"] * args.connections * cap), "s", "derived", "bytes per node / throughput"
    )
    p["s3_single_stream_s"] = param(per_node / (eff["single_stream_efficiency"] * cap), "s", "derived")
    snap = snapshot_Bps or 5e9
    p["snapshot_Bps"] = param(snap, "bytes/s", "measured" if snapshot_Bps else "assumed", "host memory copy")
    p["snapshot_stall_s"] = param(per_node / snap, "s", "derived", "the step loop's wait per async save")
    p["collective_timeout_s"] = param(1800.0, "s", "assumed", "the seed's baseline NCCL timeout")
    rec = recovery or {}
    here = "tiny trainer, 2 local nodes x 2 ranks, this run (devtools/harness/recovery.py)"
    if rec.get("crash_detect_s") is not None:
        # A dead rank is seen when its process exits, not at a heartbeat; at least 1 s, to stay honest at scale.
        p["crash_detect_s"] = param(max(1.0, rec["crash_detect_s"]), "s", "measured", "a killed rank: " + here)
    else:
        p["crash_detect_s"] = param(5.0, "s", "spec default", "a dead rank is seen at the next 5 s heartbeat")
    hs = HealthSettings()
    if rec.get("hang_detect_s") is not None:
        p["hang_detect_s"] = param(rec["hang_detect_s"], "s", "measured", "a hang at the fast test floor: " + here)
    else:
        p["hang_detect_s"] = param(hs.hang_floor_s, "s", "spec default", "health.hang_floor_s")
    p["relaunch_s"] = param(args.relaunch_s, "s", "assumed", "SageMaker full relaunch: provision, image, rendezvous")
    if rec.get("in_place_restart_s") is not None:
        p["in_place_restart_s"] = param(
            rec["in_place_restart_s"], "s", "measured", "verdict -> ranks restored, median of the faults: " + here
        )
    else:
        p["in_place_restart_s"] = param(30.0, "s", "assumed", "not measured in this run (--no-recovery)")
    p["spare_swap_s"] = param(90.0, "s", "assumed", "a pre-flighted hot spare joins: not measured yet")
    p["peer_replica_Bps"] = param(12.5e9, "bytes/s", "assumed", "100 Gb/s between nodes for the peer's memory copy")
    p["baseline_interval_s"] = param(7200.0, "s", "assumed", "the seed's S3 checkpoint every 2 h")
    return p


def policies(p: dict) -> list[simulate.Policy]:
    v = {k: x["value"] for k, x in p.items()}
    mtbf = v["job_mtbf_s"]

    def detect(cause: str) -> float:
        return v["hang_detect_s"] if cause in HANGS else v["crash_detect_s"]

    kind = {c: k for c, _, k in CAUSES}
    base_stall = v["s3_single_stream_s"]  # torch.save, then one upload stream: training waits for both

    def baseline(_cause: str) -> simulate.Recovery:
        return simulate.Recovery(v["collective_timeout_s"], v["relaunch_s"], v["s3_single_stream_s"])

    def relaunch(cause: str) -> simulate.Recovery:
        return simulate.Recovery(detect(cause), v["relaunch_s"], v["s3_restore_parallel_s"])

    def in_place(cause: str) -> simulate.Recovery:
        if kind[cause] == "node":  # the node is replaced by a spare, which reads its shard from the peer
            return simulate.Recovery(
                detect(cause), v["spare_swap_s"], v["bytes_per_node"] / v["peer_replica_Bps"], True
            )
        return simulate.Recovery(detect(cause), v["in_place_restart_s"], v["bytes_per_node"] / v["snapshot_Bps"], True)

    stall = v["snapshot_stall_s"]
    yd = max(advice.young_daly(stall, mtbf), v["s3_restore_parallel_s"])  # an upload must finish before the next
    p["aerie_s3_interval_s"] = param(yd, "s", "derived", "Young–Daly sqrt(2 C MTBF) on the snapshot stall")
    p["aerie_memory_interval_s"] = param(
        advice.young_daly(stall, mtbf), "s", "derived", "Young–Daly on the memory tier"
    )
    return [
        simulate.Policy("a_baseline", v["baseline_interval_s"], base_stall, baseline),
        simulate.Policy("b_aerie_relaunch_s3", yd, stall, relaunch),
        simulate.Policy(
            "c_aerie_in_place",
            v["baseline_interval_s"],
            stall,
            in_place,
            mem_interval_s=advice.young_daly(stall, mtbf),
            mem_stall_s=stall,
        ),
    ]


def project(args, p: dict) -> dict:
    horizon = args.days * 86400.0
    rate = 1 / p["job_mtbf_s"]["value"]
    shares = [(c, w) for c, w, _ in CAUSES]
    pols = policies(p)
    runs: dict[str, list[dict]] = {pol.name: [] for pol in pols}
    for r in range(args.replications):
        failures = simulate.failure_trace(horizon, rate, shares, random.Random(args.seed * 1000 + r))
        for pol in pols:  # the same failures for every policy
            runs[pol.name].append(simulate.run(horizon, failures, pol))
    out = {}
    for name, rs in runs.items():
        cats = {c.value: statistics.fmean(x["categories_s"][c.value] for x in rs) / horizon for c in Category}
        out[name] = {
            "goodput": statistics.fmean(x["goodput"] for x in rs),
            "goodput_min": min(x["goodput"] for x in rs),
            "failures_mean": statistics.fmean(x["failures"] for x in rs),
            "badput_share": {k: x for k, x in cats.items() if k != Category.PRODUCTIVE},
        }
    return out


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = {
        "productive": "#2f9e5b", "launch": "#8fa3bf", "startup": "#b3c0d4", "preflight": "#6c7fa0",
        "checkpoint_stall": "#e0a526", "detection": "#d1453b", "restart": "#9c4fc9", "restore": "#4aa3c9",
        "redone": "#f07c4a", "eval": "#c9b44a", "idle": "#d6d9df",
    }  # fmt: skip
    names = list(result)
    fig, ax = plt.subplots(figsize=(9, 3.4))
    for i, name in enumerate(names):
        left = 0.0
        shares = result[name]["badput_share"]
        for cat in Category:
            if cat is Category.PRODUCTIVE:
                continue
            w = 100 * shares[cat.value]
            if w > 0:
                ax.barh(i, w, left=left, color=colours[cat.value], label=LABELS[cat] if i == 0 else None)
                left += w
        ax.text(left + 0.2, i, f"goodput {100 * result[name]['goodput']:.1f}%", va="center", fontsize=9)
    ax.set_yticks(range(len(names)), [n.replace("_", " ") for n in names])
    ax.invert_yaxis()
    ax.set_xlabel("badput, % of paid GPU time (30 days, 4,000 GPUs, Llama 3 failure mix)")
    ax.set_xlim(0, max(100 * (1 - r["goodput"]) for r in result.values()) * 1.35 + 1)
    ax.legend(fontsize=8, ncol=3, loc="lower right", frameon=False)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    numbers = {"days": 30.0, "replications": 20, "seed": 24, "connections": 16, "relaunch-s": 600.0, "measure-mb": 64}
    for name, default in numbers.items():  # each parsed as its default's type
        ap.add_argument(f"--{name}", type=type(default), default=default)
    ap.add_argument("--no-measure", action="store_true", help="use the stated assumptions only (fast)")
    ap.add_argument("--no-recovery", action="store_true", help="skip the in-place recovery run (about 90 s)")
    ap.add_argument("--plot", default=str(ROOT / "docs" / "img" / "goodput.png"), help="'' to skip the plot")
    args = ap.parse_args()
    measured, snapshot, recovery = None, None, None
    t0 = time.perf_counter()
    if not args.no_measure:
        measured = measure_restore(args.connections, args.measure_mb)
        snapshot = measure_snapshot(min(args.measure_mb, 256))
        log(f"measured in {time.perf_counter() - t0:.1f}s: {measured}, snapshot {snapshot / MB:.0f} MB/s")
        if not args.no_recovery:
            log("measuring in-place recovery (the tiny trainer's rank faults, about 90 s)")
            recovery = measure_recovery()
            log(f"in-place recovery: {recovery['faults']}")
    p = parameters(args, measured, snapshot, recovery)
    result = project(args, p)
    a, c = result["a_baseline"], result["c_aerie_in_place"]
    ratio = (1 - a["goodput"]) / max(1e-12, 1 - c["goodput"])
    goals = {
        "c_goodput_at_least_0.98": c["goodput"] >= 0.98,
        "a_over_c_badput_at_least_5x": ratio >= 5,
    }
    if args.plot:
        plot(result, Path(args.plot))
    line = {
        "bench": "goodput_at_scale",
        "policies": result,
        "badput_ratio_a_over_c": ratio,
        "goals": goals,
        "goals_met": all(goals.values()),
        "parameters": p,
        "measured": sorted(k for k, x in p.items() if x["source"] == "measured"),
        "assumed": sorted(k for k, x in p.items() if x["source"] == "assumed"),
        "policy_c_uses_assumed_recovery": recovery is None,
        "seed": args.seed,
        "replications": args.replications,
        "plot": args.plot or None,
        "wall_s": time.perf_counter() - t0,
    }
    print(json.dumps(line))


if __name__ == "__main__":
    main()
