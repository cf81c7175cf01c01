"""Time to detect each silent failure vs the collective timeout it replaces.

Runs the tiny trainer on 2 local nodes x 2 processes through a real control plane, injects each
fault at a known step, and measures from the fault (the last healthy step's timestamp) to the
moment the attempt was ended with a named cause. Prints one JSON line: per fault the median and
worst time-to-detect, the ratio to PyTorch's default 600 s collective timeout, and the goal
max(30 s, 3 x p95 step time).

    .venv/bin/python bench/detect.py [--runs 2] [--faults sigstop,busy_hang,nan,sigkill]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from orchestrator.harness.control_plane import ControlPlane  # noqa: E402
from orchestrator.harness.jobs import FAST_HEALTH, step_records, trainer_spec  # noqa: E402

FAULT_STEP = 12
COLLECTIVE_TIMEOUT_S = 600.0
FAULTS = {
    "sigstop": {"kind": "sigstop", "step": FAULT_STEP, "rank": 1},
    "busy_hang": {"kind": "busy_hang", "step": FAULT_STEP, "rank": 1},
    "nan": {"kind": "nan", "step": FAULT_STEP},
    "sigkill": {"kind": "sigkill", "step": FAULT_STEP, "rank": 3},
}


def measure(cp: ControlPlane, work: Path, name: str, fault: dict) -> dict:
    spec = trainer_spec(work / f"{name}.json", name, steps=400, faults=[fault])
    cp.cli("submit", str(spec), check=True)
    job = cp.wait_state(name, {"Completed", "Failed", "Stopped"}, timeout_s=600)
    attempt = job["attempt_list"][0]
    recs = step_records(cp.home / "jobs" / job["id"] / "attempt-1", rank=None)
    healthy = [r for r in recs if r["step"] < FAULT_STEP]
    fault_at = (
        max(r["t"] for r in healthy) if fault["kind"] != "nan" else min(r["t"] for r in recs if r["step"] == FAULT_STEP)
    )
    verdicts = [v for v in job["verdicts"] if v["kind"] == (attempt.get("reason") or {}).get("kind")]
    detected_at = verdicts[0]["t"] if verdicts else attempt["ended_at"]
    step_times = sorted(r["step_s"] for r in healthy if r["step"] > 2 and r.get("step_s"))
    p95 = step_times[int(0.95 * (len(step_times) - 1))] if step_times else None
    return {
        "reason": (attempt.get("reason") or {}).get("kind"),
        "detect_s": detected_at - fault_at,
        "ended_s": attempt["ended_at"] - fault_at,
        "p95_step_s": p95,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=2)
    p.add_argument("--faults", default=",".join(FAULTS))
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="aerie-bench-detect-"))
    (work / "home").mkdir()
    cp = ControlPlane(work / "home").start()
    results: dict[str, dict] = {}
    try:
        for kind in args.faults.split(","):
            runs = []
            for i in range(args.runs):
                r = measure(cp, work, f"detect-{kind.replace('_', '-')}-{i}", FAULTS[kind])
                print(f"{kind} run {i}: {r}", file=sys.stderr, flush=True)
                runs.append(r)
            detect = [r["detect_s"] for r in runs]
            p95 = max((r["p95_step_s"] or 0.0) for r in runs)
            goal = max(30.0, 3 * p95)
            results[kind] = {
                "reasons": sorted({r["reason"] for r in runs}),
                "detect_s_median": round(statistics.median(detect), 2),
                "detect_s_max": round(max(detect), 2),
                "attempt_ended_s_max": round(max(r["ended_s"] for r in runs), 2),
                "ratio_vs_collective_timeout": round(max(detect) / COLLECTIVE_TIMEOUT_S, 4),
                "goal_s": round(goal, 1),
                "meets_goal": max(detect) <= goal,
            }
    finally:
        cp.stop()
        cp.cleanup_nodes()
    print(
        json.dumps(
            {
                "bench": "detect",
                "runs_per_fault": args.runs,
                "collective_timeout_s": COLLECTIVE_TIMEOUT_S,
                "health": FAST_HEALTH,
                "faults": results,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
