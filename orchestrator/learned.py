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


def learned_env(job: Job, before: int) -> dict[str, str]:
    """`{"AERIE_SECTIONS": ...}` for the attempt numbered `before`, or {} when nothing was learned."""
    learned = learned_sections(job, before)
    return {SECTIONS: json.dumps(compact_learned(learned), separators=(",", ":"))} if learned else {}
