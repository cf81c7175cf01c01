"""What the agent's monitoring costs (issue 7, acceptance 4).

Starts N simulated ranks (separate processes that burn a little CPU and append a metrics line
per step, like the trainer), runs the agent's Monitor in this process at one tick per
``--sample-s`` for ``--duration`` seconds, and prints ONE JSON line: the monitor's CPU time
divided by wall time, as a share of one core, against the goal (< 2 %).

    .venv/bin/python bench/agent_overhead.py [--ranks 8] [--duration 30] [--sample-s 1]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

GOAL = 0.02


def rank_main(rank: int, metrics: Path, pid_dir: Path, step_s: float, burn_s: float) -> None:
    """One simulated rank: a metrics line per step (the contract's keys) and some CPU."""
    (pid_dir / f"rank-{rank}.pid").write_text(str(os.getpid()))
    out = open(metrics / f"rank-{rank:05d}.jsonl", "a", buffering=1)
    step = 0
    while True:
        t0 = time.time()
        end = time.process_time() + burn_s
        while time.process_time() < end:
            pass
        step += 1
        out.write(
            json.dumps(
                {
                    "t": time.time(),
                    "rank": rank,
                    "step": step,
                    "loss": 3.0 / (1 + step * 1e-3),
                    "grad_norm": 1.0,
                    "lr": 3e-4,
                    "tokens": step * 8192,
                    "step_s": time.time() - t0,
                    "event": None,
                }
            )
            + "\n"
        )
        time.sleep(max(0.0, step_s - (time.time() - t0)))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--duration", type=float, default=30.0)
    ap.add_argument("--sample-s", type=float, default=1.0)
    ap.add_argument("--step-s", type=float, default=0.25, help="simulated step time (4 lines/s/rank)")
    ap.add_argument("--burn-s", type=float, default=0.01, help="CPU each simulated rank burns per step")
    ap.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--root", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rank is not None:
        return rank_main(
            args.rank, args.root / "output" / "metrics", args.root / "agent" / "ranks", args.step_s, args.burn_s
        )

    from agent.monitor import Monitor

    root = Path(tempfile.mkdtemp(prefix="agent-overhead-"))
    (root / "output" / "metrics").mkdir(parents=True)
    (root / "agent" / "ranks").mkdir(parents=True)
    ranks = [
        subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--rank",
                str(r),
                "--root",
                str(root),
                "--step-s",
                str(args.step_s),
                "--burn-s",
                str(args.burn_s),
            ]
        )
        for r in range(args.ranks)
    ]
    try:
        while len(list((root / "agent" / "ranks").glob("rank-*.pid"))) < args.ranks:
            time.sleep(0.05)
        mon = Monitor(
            node_dir=root / "agent",
            metrics_dir=root / "output" / "metrics",
            health={},
            sample_s=args.sample_s,
            interfaces=None,
        )
        mon.tick()  # warm-up: first sight of every process and counter
        ticks, verdicts, tick_cpu = 0, [], []
        cpu0, wall0 = time.process_time(), time.monotonic()
        next_t = wall0 + args.sample_s
        while time.monotonic() - wall0 < args.duration:
            time.sleep(max(0.0, next_t - time.monotonic()))
            next_t += args.sample_s
            c = time.process_time()
            verdicts += mon.tick()
            mon.summary()  # a heartbeat's worth of work every tick (real heartbeats are every 5 s)
            tick_cpu.append(time.process_time() - c)
            ticks += 1
        cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
        summary = mon.summary()
    finally:
        for p in ranks:
            p.send_signal(signal.SIGKILL)
            p.wait()
    share = cpu / wall
    tick_cpu.sort()
    print(
        json.dumps(
            {
                "bench": "agent_overhead",
                "ranks": args.ranks,
                "sample_s": args.sample_s,
                "wall_s": round(wall, 2),
                "ticks": ticks,
                "accelerator_kind": summary["accelerator_kind"],
                "nics": [n["name"] for n in summary["nics"]],
                "metrics_lines_per_s": round(args.ranks / args.step_s, 1),
                "last_step": summary["last_step"],
                "monitor_cpu_s": round(cpu, 4),
                "cpu_share_of_one_core": round(share, 5),
                "tick_cpu_ms_p50": round(1000 * tick_cpu[len(tick_cpu) // 2], 3),
                "tick_cpu_ms_max": round(1000 * tick_cpu[-1], 3),
                "goal": GOAL,
                "ratio_to_goal": round(share / GOAL, 3),
                "ok": share < GOAL,
                "verdicts": [v.kind for v in verdicts],
            }
        )
    )


if __name__ == "__main__":
    main()
