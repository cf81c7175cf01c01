"""The torch half of pre-flight, run as a short-lived subprocess (`python -m agent.preflight.torchprobe
JSON`) so the agent itself never imports torch: a matmul burn on each accelerator, then, with more
than one node, a gloo group across the attempt's nodes for an all-reduce of a fixed size and a
per-link probe. It measures only; the agent judges (agent/preflight/judge.py). The last stdout line
is `PREFLIGHT <json>`.

Per-link probe: node j sends the buffer to its ring successor (j+1) mod n while the others wait,
one link at a time, and the receiver times it; the rates are all-gathered, so node j learns the
rate of its own outgoing link. A link shaped at its sender (netem, a bad NIC's egress) shows on
that link alone, which names the sender: with two nodes an all-reduce alone could not say which.
"""

from __future__ import annotations

import importlib
import json
import sys
import time
from datetime import timedelta
from typing import Any

MiB = 1024 * 1024
CHUNKS = 8  # the link probe's buffer goes in this many sends (a throttled sender sleeps between them)
TAG = "PREFLIGHT "


def _torch() -> Any:
    """torch, imported here only, in the probe's own process (the agent that imports this module
    for its constants stays torch-free, as agent/warm.py's ranks do)."""
    return importlib.import_module("torch")


def burn(cfg: dict[str, Any]) -> dict[str, Any]:
    """Each accelerator's matmul rate over `burn_s`: GPUs in TFLOP/s (bf16), else one CPU core in
    GFLOP/s (float32). `slow_compute` sleeps between matmuls, to a tenth of the minimum rate."""
    torch = _torch()

    out: dict[str, Any] = {}
    n, burn_s = int(cfg["matrix_n"]), float(cfg["burn_s"])
    if cfg.get("gpus") and torch.cuda.is_available():
        rates = {}
        for d in range(torch.cuda.device_count()):
            dev = torch.device("cuda", d)
            a = torch.randn(max(n, 4096), max(n, 4096), device=dev, dtype=torch.bfloat16)
            rates[str(d)] = _rate(lambda a=a: a @ a, 2 * a.shape[0] ** 3, burn_s, torch.cuda.synchronize, cfg, 1e12)
        out["gpu_tflops"] = rates
        return out
    torch.set_num_threads(1)  # one core's rate: comparable across nodes whatever else runs there
    a = torch.randn(n, n)
    out["cpu_gflops"] = _rate(lambda: a @ a, 2 * n**3, burn_s, lambda: None, cfg, 1e9)
    return out


def _rate(op, flops: float, burn_s: float, sync, cfg: dict[str, Any], unit: float) -> float:
    op()
    sync()  # warm-up: allocation and kernel selection are not the rate
    slow_to = float(cfg.get("min_rate") or 0) / 10 or 0.05  # slow_compute: a tenth of the minimum
    done, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < burn_s:
        ts = time.perf_counter()
        op()
        sync()
        done += 1
        if cfg.get("slow_compute"):
            time.sleep(max(0.0, flops / (slow_to * unit) - (time.perf_counter() - ts)))
    return done * flops / (time.perf_counter() - t0) / unit


def collective(cfg: dict[str, Any]) -> dict[str, Any]:
    torch = _torch()
    dist = importlib.import_module("torch.distributed")

    n, rank = int(cfg["nodes"]), int(cfg["node_rank"])
    size = max(CHUNKS, int(float(cfg["collective_mb"]) * MiB) // 4 // CHUNKS * CHUNKS)  # float32 elements
    nbytes = size * 4
    throttle = float(cfg.get("throttle_bps") or 0) if cfg.get("slow_link") else 0.0
    t0 = time.perf_counter()
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://{cfg['master_addr']}:{cfg['port']}",
        rank=rank,
        world_size=n,
        timeout=timedelta(seconds=float(cfg["timeout_s"])),
    )
    joined_s = time.perf_counter() - t0
    try:
        buf = torch.ones(size)
        dist.all_reduce(torch.ones(1024))  # warm-up: connections made
        links = torch.zeros(n)  # links[j]: bytes/s of link j -> (j+1) % n, as its receiver timed it
        chunks = buf.chunk(CHUNKS)
        for j in range(n):
            dst = (j + 1) % n
            dist.barrier()
            if rank == j:
                for c in chunks:
                    dist.send(c, dst)
                    if throttle:
                        time.sleep(c.numel() * 4 / throttle)
            elif rank == dst:
                ts = time.perf_counter()
                for c in chunks:
                    dist.recv(c, j)
                links[j] = nbytes / (time.perf_counter() - ts)
        gathered = [torch.zeros(n) for _ in range(n)]
        dist.all_gather(gathered, links)
        rates = torch.stack(gathered).max(dim=0).values  # each link was timed by its receiver only
        dist.barrier()
        ts = time.perf_counter()
        if throttle:
            time.sleep(nbytes / throttle)  # this node's share of the ring passes its slow egress
        dist.all_reduce(buf)
        took = time.perf_counter() - ts
        ok = bool(abs(float(buf[0]) - n) < 1e-3)  # every node's ones arrived
    finally:
        dist.destroy_process_group()
    return {
        "bytes": nbytes,
        "joined_s": round(joined_s, 3),
        "allreduce_s": round(took, 4),
        # bus bandwidth (nccl-tests' convention): what each link carried in a ring all-reduce
        "allreduce_busbw_gbps": round(nbytes * 2 * (n - 1) / n / took * 8 / 1e9, 4),
        "links_gbps": [round(float(r) * 8 / 1e9, 4) for r in rates],
        "sum_ok": ok,
    }


def main(argv: list[str]) -> int:
    cfg = json.loads(argv[1])
    t0 = time.perf_counter()
    out: dict[str, Any] = {}
    try:
        _torch()
    except Exception as exc:
        print(TAG + json.dumps({"error": f"torch not importable: {exc}"}), flush=True)
        return 0
    timings = out["timings"] = {"import_s": round(time.perf_counter() - t0, 3)}  # where the time went
    try:
        out["burn"] = burn(cfg)
    except Exception as exc:
        out["burn_error"] = f"{type(exc).__name__}: {exc}"
    timings["burn_s"] = round(time.perf_counter() - t0 - timings["import_s"], 3)
    if int(cfg.get("nodes", 1)) > 1:
        try:
            out["collective"] = collective(cfg)
        except Exception as exc:
            out["collective_error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        timings["collective_s"] = round(time.perf_counter() - t0 - timings["import_s"] - timings["burn_s"], 3)
    print(TAG + json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
