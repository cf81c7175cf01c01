"""What the in-process probe costs a training step (issue #33, acceptance 4): one JSON line.

Two workloads, each run as its users run it, with the probe injected as `agent.rank` injects it
(`agent.inproc.child_env`, `AERIE_PROBE=on`) and without it (`AERIE_PROBE=off`), the two
alternating, `--trials` times each, in this one run:

- `tiny_trainer`: Aerie's own trainer (`python -m trainer.train`) on pythia-tiny, one rank, the
  stdlib corpus, no checkpoints (fused AdamW; a step of a few milliseconds on one CPU thread);
- `lightning`: `examples/byo/lightning_train.py` unchanged (Lightning's default Rich bar, default
  logger and `ModelCheckpoint`), a regression of one `Linear` on one CPU thread: a step of about a
  millisecond, nearly all of it Lightning's own loop — the worst case for a per-step cost.

The step time is the same clock in both configurations: a wrapper (the bench's, not the
probe's) imports torch, registers one more optimizer step post-hook that appends
`time.perf_counter()`, then runs the script with `runpy`. With the probe on, its hooks were
registered first (at that torch import), so an interval between two of the wrapper's stamps holds
the probe's whole per-step work. A trial's step time is the median interval after its first
`WARMUP` steps; a configuration's is the median of its trials'.

Goal per workload: `overhead = step(on) / step(off) - 1 <= 1 %` (`goal_met`, computed from that
figure alone). `noise` is the spread of the off trials' medians around their median, the
resolution the overhead is read against; the absolute `added_us` per step says what a real step
(hundreds of milliseconds at scale) pays. Measured on a shared, 2-core machine: see the line.

    .venv/bin/python bench/probe.py [--trials 3] [--steps 400]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from aerie_contracts import env as E  # noqa: E402
from agent import inproc  # noqa: E402

GOAL = 0.01
WARMUP = 20  # steps left out of a trial's median: allocator, caches, Lightning's first batches

# The bench's own clock: the same in both configurations, registered after the probe's hooks.
TIMER = """
import atexit, importlib, json, os, runpy, sys, time
import torch
stamps = []
optim = importlib.import_module("torch.optim.optimizer")
optim.register_optimizer_step_post_hook(lambda *_: stamps.append(time.perf_counter()))
atexit.register(lambda: open(os.environ["BENCH_STAMPS"], "w").write(json.dumps(stamps)))
args = sys.argv[1:]
if args[0] == "-m":
    sys.argv = args[1:]
    runpy.run_module(args[1], run_name="__main__", alter_sys=True)
else:
    sys.argv = args
    runpy.run_path(args[0], run_name="__main__")
"""


def _tiny_config(work: Path, steps: int) -> Path:
    import yaml

    cfg = {
        "model": {"preset": "pythia-tiny"},
        "data": {"corpus": "stdlib", "max_bytes": 1_000_000, "cache_dir": str(work / "data-cache")},
        "seq_len": 64,
        "micro_batch_size": 4,
        "steps": steps,
        "warmup": 5,
        "print_every": 0,
        "instance_type": "c7i.xlarge",
    }
    path = work / "tiny.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def workloads(work: Path, steps: int) -> dict[str, list[str]]:
    return {
        "tiny_trainer": ["-m", "trainer.train", "--config", str(_tiny_config(work, steps))],
        "lightning": [
            str(REPO / "examples" / "byo" / "lightning_train.py"),
            "--max-steps",
            str(steps),
            "--samples",
            str(8 * steps),
            "--root-dir",
            str(work / "lightning"),
        ],
    }


def trial(work: Path, name: str, argv: list[str], probe: str, n: int) -> float:
    """One run of the workload; its median step interval in seconds."""
    run_dir = work / f"{name}-{n}-{probe}"
    run_dir.mkdir()
    stamps = run_dir / "stamps.json"
    base = {k: v for k, v in os.environ.items() if not k.startswith(("AERIE_", "SM_"))}
    base.update(
        {
            "PYTHONPATH": str(REPO),
            "OMP_NUM_THREADS": "1",
            E.PROBE: probe,
            E.METRICS_PATH: str(run_dir / "metrics"),
            E.NODE_DIR: str(run_dir / "agent"),
            "SM_OUTPUT_DATA_DIR": str(run_dir / "output"),
            E.CHECKPOINT_URI: "",
            E.RESUME_FROM: "",
            "BENCH_STAMPS": str(stamps),
        }
    )
    env = inproc.child_env(base)  # as agent.rank starts a rank: the probe's site first, or nothing
    timer = work / "timer.py"
    proc = subprocess.run(
        [sys.executable, str(timer), *argv], cwd=run_dir, env=env, capture_output=True, text=True, timeout=900
    )
    if proc.returncode != 0 or not stamps.exists():
        raise SystemExit(f"{argv[:3]} with the probe {probe} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    if probe == "on" and not (run_dir / "metrics").exists():
        raise SystemExit(f"{argv[:3]}: the probe was on but wrote no records")
    times = json.loads(stamps.read_text())[WARMUP:]
    if len(times) < 20:
        raise SystemExit(f"{argv[:3]}: only {len(times)} steps after the warm-up")
    return statistics.median(b - a for a, b in itertools.pairwise(times))


def measure(work: Path, name: str, argv: list[str], trials: int) -> dict:
    off: list[float] = []
    on: list[float] = []
    for n in range(trials):
        # Alternating (off first, then on first), so a drift of the host's load hits both alike.
        order = ("off", "on") if n % 2 == 0 else ("on", "off")
        for probe in order:
            t = trial(work, name, argv, probe, n)
            (off if probe == "off" else on).append(t)
            print(f"{name} trial {n + 1} probe {probe}: {t * 1e6:.0f} us/step", file=sys.stderr)
    step_off, step_on = statistics.median(off), statistics.median(on)
    overhead = step_on / step_off - 1
    return {
        "step_us_off": round(step_off * 1e6, 1),
        "step_us_on": round(step_on * 1e6, 1),
        "added_us": round((step_on - step_off) * 1e6, 1),
        "overhead": round(overhead, 4),
        "noise": round(max(abs(t / step_off - 1) for t in off), 4),
        "trials_us_off": [round(t * 1e6, 1) for t in off],
        "trials_us_on": [round(t * 1e6, 1) for t in on],
        "goal_met": overhead <= GOAL,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=3, help="runs per configuration (default 3)")
    parser.add_argument("--steps", type=int, default=400, help="optimizer steps per run (default 400)")
    parser.add_argument("--only", choices=("tiny_trainer", "lightning"), help="one workload only")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-probe-") as tmp:
        work = Path(tmp)
        (work / "timer.py").write_text(TIMER)
        results = {
            name: measure(work, name, argv, args.trials)
            for name, argv in workloads(work, args.steps).items()
            if args.only in (None, name)
        }
    line = {
        "bench": "probe",
        "goal": f"overhead <= {GOAL:.0%} per workload",
        "trials": args.trials,
        "steps": args.steps,
        "cpus": os.cpu_count(),
        "load_1m": round(os.getloadavg()[0], 2),
        **results,
        "goal_met": all(r["goal_met"] for r in results.values()),
    }
    print(json.dumps(line))


if __name__ == "__main__":
    main()
