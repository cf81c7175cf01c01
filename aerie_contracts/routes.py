"""The API's paths, built in one place: every caller (CLI, agent, handlers, the checkpoint fence,
the recovery package) asks these builders for a path instead of writing the `/v1/...` literal itself.

Each builder quotes its parameters (a job name or a host may hold characters a path cannot), so a
caller never forgets to. `ROUTES` lists every (method, template) the callers use; a test checks
each against the API's own routers, so a renamed route breaks a test rather than a node in a
running job. Standard library only: the Lambda bundle and the torch-free agent import it.
"""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import quote

PREFIX = "/v1"


def _q(part: object) -> str:
    return quote(str(part), safe="")


def _below(parent: Callable[[str], str], suffix: str) -> Callable[[str], str]:
    """A builder for `suffix` under what `parent` builds (one line per route, below)."""
    return lambda ref: parent(ref) + suffix


# Jobs (the CLI, the handlers, the recovery package)
def jobs() -> str:
    return f"{PREFIX}/jobs"


def _item(collection: str) -> Callable[[str], str]:
    """A builder for one item of `collection`, its id quoted."""
    return lambda ref: f"{PREFIX}{collection}/{_q(ref)}"


job = _item("/jobs")


job_stop = _below(job, "/stop")
job_fail = _below(job, "/fail")
job_chaos = _below(job, "/chaos")
job_events = _below(job, "/events")
job_goodput = _below(job, "/goodput")
job_logs = _below(job, "/logs")
job_attempts = _below(job, "/attempts")
job_checkpoints = _below(job, "/checkpoints")
job_checkpoint_states = _below(job, "/checkpoints/state")
# Human eval (the eval handlers, Slack's interactions, `aerie ratings`)
job_eval_samples = _below(job, "/eval/samples")
job_ratings = _below(job, "/ratings")


def attempt_blames(ref: str, number: int) -> str:
    return f"{job_attempts(ref)}/{int(number)}/blames"


eval_sample = _item("/eval/samples")


eval_sample_claim = _below(eval_sample, "/claim")
eval_sample_posted = _below(eval_sample, "/posted")
eval_sample_ratings = _below(eval_sample, "/ratings")


# Tokens (`aerie token ...`)
def tokens() -> str:
    return f"{PREFIX}/tokens"


def token(token_id: int) -> str:
    return f"{tokens()}/{int(token_id)}"


# An attempt, as its nodes and its checkpoint fence see it (agent token auth)
attempt = _item("/attempts")


attempt_checkpoints = _below(attempt, "/checkpoints")
attempt_checkpoints_bad = _below(attempt, "/checkpoints/bad")


def node(attempt_id: str, host: str) -> str:
    """A node of an attempt; the agent appends one of `NODE_CALLS`."""
    return f"{attempt(attempt_id)}/nodes/{_q(host)}"


# What a node's agent says and asks, below `node(...)`.
HEARTBEAT, VERDICTS, PREFLIGHT, EXIT, CHECKPOINTS, METRICS, NEXT = (
    "/heartbeat",
    "/verdicts",
    "/preflight",
    "/exit",
    "/checkpoints",
    "/metrics",
    "/next",
)
NODE_CALLS = (HEARTBEAT, VERDICTS, PREFLIGHT, EXIT, CHECKPOINTS, METRICS, NEXT)

_JOB, _ATTEMPT, _NODE = f"{PREFIX}/jobs/{{job_ref}}", f"{PREFIX}/attempts/{{attempt_id}}", "/nodes/{host}"
_SAMPLE = f"{PREFIX}/eval/samples/{{sample_id}}"
# Every (method, path template) a caller builds, in the routers' own parameter names.
ROUTES: tuple[tuple[str, str], ...] = (
    ("POST", f"{PREFIX}/jobs"),
    ("GET", f"{PREFIX}/jobs"),
    ("GET", _JOB),
    ("POST", f"{_JOB}/stop"),
    ("POST", f"{_JOB}/fail"),
    ("POST", f"{_JOB}/chaos"),
    ("GET", f"{_JOB}/events"),
    ("GET", f"{_JOB}/goodput"),
    ("GET", f"{_JOB}/logs"),
    ("POST", f"{_JOB}/attempts"),
    ("POST", f"{_JOB}/attempts/{{number}}/blames"),
    ("GET", f"{_JOB}/checkpoints"),
    ("POST", f"{_JOB}/checkpoints/state"),
    ("GET", f"{_JOB}/eval/samples"),
    ("POST", f"{_JOB}/eval/samples"),
    ("GET", f"{_JOB}/ratings"),
    ("POST", f"{_SAMPLE}/claim"),
    ("POST", f"{_SAMPLE}/posted"),
    ("POST", f"{_SAMPLE}/ratings"),
    ("POST", f"{PREFIX}/tokens"),
    ("GET", f"{PREFIX}/tokens"),
    ("DELETE", f"{PREFIX}/tokens/{{token_id}}"),
    ("GET", _ATTEMPT),
    ("POST", f"{_ATTEMPT}/checkpoints"),
    ("GET", f"{_ATTEMPT}/checkpoints"),
    ("POST", f"{_ATTEMPT}/checkpoints/bad"),
    *(("POST", f"{_ATTEMPT}{_NODE}{call}") for call in (HEARTBEAT, VERDICTS, PREFLIGHT, EXIT, CHECKPOINTS, METRICS)),
    ("GET", f"{_ATTEMPT}{_NODE}{PREFLIGHT}"),
    ("GET", f"{_ATTEMPT}{_NODE}{NEXT}"),
)
