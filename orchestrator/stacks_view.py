"""What each rank was doing when its node called a hang, as text lines: the hang verdicts' `ranks`
evidence (agent/diagnose.py), the rank the others waited for found by `recovery.hang_root`.
`aerie describe` prints these lines; the dashboard's job page shows the same lines."""

from __future__ import annotations

from typing import Any

from recovery import hang_root

STACK_FRAMES_SHOWN = 12  # of the root cause's main thread, innermost first (the whole dump: the verdict's evidence)


def stop_time_lines(verdicts: list[dict[str, Any]]) -> list[str]:
    """Per attempt with stacks: a heading naming the root cause, a line per rank, and the main
    thread's innermost frames of the rank the others waited for. `verdicts`: the API's shape
    (`attempt_id`, `host`, `kind`, `t`, `evidence`)."""
    lines: list[str] = []
    for attempt in dict.fromkeys(v["attempt_id"] for v in verdicts):
        of_attempt = [v for v in verdicts if v["attempt_id"] == attempt]
        views = hang_root.views_from_verdicts(of_attempt)
        if not views:
            continue
        root = hang_root.find_root_cause(views)
        culprits = {(r.host, r.rank) for r in root.culprits} if root else set()
        lines.append(f"stacks at stop time, {attempt}" + (f": {root.message}" if root else ": no rank singled out"))
        raw = {
            (v["host"], str(k)): r
            for v in of_attempt
            for k, r in ((v.get("evidence") or {}).get("ranks") or {}).items()
        }
        for r in sorted(views, key=lambda r: (r.host, int(r.rank) if r.rank.isdigit() else 0)):
            doing = "stopped" if r.stopped else "waiting" if r.waiting else "not waiting" if r.answered else "no answer"
            inside = f" in {r.in_collective}" if r.in_collective else ""
            count = f", {r.collectives} collectives" if r.collectives is not None else ""
            mark = "  <- root cause" if (r.host, r.rank) in culprits else ""
            lines.append(f"  {r.host} rank {r.rank}: {doing}{inside}{count}; at {r.frame or '?'}{mark}")
            if (r.host, r.rank) in culprits:
                frames = hang_root.main_thread_frames(str((raw.get((r.host, r.rank)) or {}).get("stack") or ""))
                lines += [f"      {file}:{line} {func}()" for file, line, func in frames[:STACK_FRAMES_SHOWN]]
    return lines
