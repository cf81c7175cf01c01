"""What a job's attempts learned about their sections, handed to its next attempt.

Each node reports its section durations in every heartbeat (`summary["sections"]`, the job's
history as the node knows it: what it was started with plus what it saw). The newest heartbeat of
every node is stored, so when the controller launches attempt N+1 it merges the summaries of the
job's earlier attempts (oldest first) and passes them on in `AERIE_SECTIONS`: a restarted attempt
starts with the learned timeouts instead of the cold ones.
"""

from __future__ import annotations

import json

from aerie_contracts.env import SECTIONS
from aerie_contracts.health import SUMMARY_SECTIONS, compact_learned, merge_learned
from orchestrator.store.models import Job


def learned_sections(job: Job, before: int) -> dict[str, list[float]]:
    """Section -> durations learned by the job's attempts numbered below `before`."""
    sources = [
        node.summary.get(SUMMARY_SECTIONS) or {}
        for attempt in sorted(job.attempts, key=lambda a: a.number)
        if attempt.number < before
        for node in attempt.nodes
        if isinstance(node.summary, dict) and isinstance(node.summary.get(SUMMARY_SECTIONS), dict)
    ]
    return merge_learned(sources)


MAX_CHARS = 500  # SageMaker caps one Environment value at 512 characters (a launch over it fails)


def learned_env(job: Job, before: int) -> dict[str, str]:
    """`{"AERIE_SECTIONS": ...}` for the attempt numbered `before`, or {} when nothing was learned.
    Fewer quantiles per section until the value fits (the max, kept last, matters most for a p95)."""
    learned = learned_sections(job, before)
    if not learned:
        return {}
    for points in (9, 7, 5, 3, 2):
        text = json.dumps(compact_learned(learned, points), separators=(",", ":"))
        if len(text) <= MAX_CHARS:
            return {SECTIONS: text}
    return {}  # cannot happen with five sections of two numbers each; never fail a launch over it
