"""The API's paths, built in one place: every caller (CLI, agent, handlers, the checkpoint fence,
the recovery package) asks these builders for a path instead of writing `"/v1/..."` itself.

Each builder quotes its parameters (a job name or a host may hold characters a path cannot), so a
caller never forgets to. `ROUTES` lists every (method, template) the callers use; a test checks
each against the API's own routers, so a renamed route breaks a test rather than a node in a
running job. Standard library only: the Lambda bundle and the torch-free agent import it.
"""

from __future__ import annotations

from urllib.parse import quote

PREFIX = "/v1"


def _q(part: object) -> str:
    return quote(str(part), safe="")


# Jobs (the CLI, the handlers, the recovery package)
def jobs() -> str:
    return f"{PREFIX}/jobs"


def job(ref: str) -> str:
    return f"{PREFIX}/jobs/{_q(ref)}"


def job_stop(ref: str) -> str:
    return f"{job(ref)}/stop"


def job_fail(ref: str) -> str:
    return f"{job(ref)}/fail"


def job_chaos(ref: str) -> str:
    return f"{job(ref)}/chaos"


def job_events(ref: str) -> str:
    return f"{job(ref)}/events"


def job_goodput(ref: str) -> str:
    return f"{job(ref)}/goodput"


def job_logs(ref: str) -> str:
    return f"{job(ref)}/logs"


def job_attempts(ref: str) -> str:
    return f"{job(ref)}/attempts"


def attempt_blames(ref: str, number: int) -> str:
    return f"{job_attempts(ref)}/{int(number)}/blames"


def job_checkpoints(ref: str) -> str:
    return f"{job(ref)}/checkpoints"


def job_checkpoint_states(ref: str) -> str:
    return f"{job_checkpoints(ref)}/state"


# Human eval (the eval handlers, Slack's interactions, `aerie ratings`)
def job_eval_samples(ref: str) -> str:
    return f"{job(ref)}/eval/samples"


def job_ratings(ref: str) -> str:
    return f"{job(ref)}/ratings"


def eval_sample(sample_id: str) -> str:
    return f"{PREFIX}/eval/samples/{_q(sample_id)}"


def eval_sample_claim(sample_id: str) -> str:
    return f"{eval_sample(sample_id)}/claim"


def eval_sample_posted(sample_id: str) -> str:
    return f"{eval_sample(sample_id)}/posted"


def eval_sample_ratings(sample_id: str) -> str:
    return f"{eval_sample(sample_id)}/ratings"


# Tokens (`aerie token ...`)
def tokens() -> str:
    return f"{PREFIX}/tokens"


def token(token_id: int) -> str:
    return f"{tokens()}/{int(token_id)}"


# An attempt, as its nodes and its checkpoint fence see it (agent token auth)
def attempt(attempt_id: str) -> str:
    return f"{PREFIX}/attempts/{_q(attempt_id)}"


def attempt_checkpoints(attempt_id: str) -> str:
    return f"{attempt(attempt_id)}/checkpoints"


def attempt_checkpoints_bad(attempt_id: str) -> str:
    return f"{attempt_checkpoints(attempt_id)}/bad"


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
