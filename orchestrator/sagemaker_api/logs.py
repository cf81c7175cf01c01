"""The CloudWatch Logs calls the SageMaker SDKs read a training job's output with, served from
Aerie's node logs: `DescribeLogStreams` and `GetLogEvents` on the log group SageMaker uses.

SageMaker writes one stream per instance, `<TrainingJobName>/algo-N-<epoch>`, in the group
`/aws/sagemaker/TrainingJobs`; the SDK's `wait(logs=True)` (2.x and 3.x) lists the streams under
the job's prefix until there is one per instance, then pages through each with GetLogEvents'
forward tokens. Here each stream is that host's output across every attempt of the job, one
after the other (a restarted job keeps one stream per host, as SageMaker's do), read through the
backend's `logs()` so it works for every backend. One line is one event; its timestamp is its
attempt's start (node logs carry no per-line clock). Tokens are `f/<attempt>/<offset>` and
`b/<attempt>/<offset>`: positions in the backend's own offsets (bytes on local and Slurm).
"""

from __future__ import annotations

import re
from typing import Any

from aerie_contracts.states import ATTEMPT_TERMINAL
from orchestrator import sagemaker_mapping as mapping
from orchestrator.sagemaker_api.call import Call, registry
from orchestrator.sagemaker_api.errors import LOGS_RESOURCE_NOT_FOUND, AwsError, validation
from orchestrator.store import repo

OPERATIONS, operation = registry()
CHUNK = 256 * 1024
MAX_RESPONSE_BYTES = 1 << 20  # GetLogEvents returns at most 1 MB, as CloudWatch does
_TOKEN = re.compile(r"^([fb])/(\d+)/(-?\d+)$")
_STREAM = re.compile(r"^([^/]+)/(.+)-(\d+)$")
TERMINAL = ATTEMPT_TERMINAL


def _group(body: dict[str, Any]) -> None:
    group = body.get("logGroupName") or body.get("logGroupIdentifier")
    if group != mapping.TRAINING_LOG_GROUP:
        raise AwsError(LOGS_RESOURCE_NOT_FOUND, "The specified log group does not exist.")


def _hosts(job) -> list[str]:
    count = int(((job.spec or {}).get("resources") or {}).get("instance_count", 1))
    return [f"algo-{i + 1}" for i in range(count)]


def _launched(job) -> list:
    return [a for a in sorted(job.attempts, key=lambda a: a.number) if a.handle]


def stream_name(record, host: str) -> str:
    return f"{record.name}/{host}-{int(record.created_at)}"


@operation("DescribeLogStreams")
def describe_log_streams(call: Call, body: dict[str, Any]) -> dict[str, Any]:
    _group(body)
    prefix = body.get("logStreamNamePrefix") or ""
    limit = body.get("limit", 50)
    if not isinstance(limit, int) or not 1 <= limit <= 50:
        raise validation("limit must be between 1 and 50")
    name = prefix.split("/", 1)[0]
    records = repo.list_sagemaker_jobs(call.session, call.who.tenant, call.region, name_prefix=name, limit=1000)
    streams = []
    for record in records:
        launched = _launched(record.job)
        if not launched:
            continue  # a stream exists once its node has started writing
        first_ms = int((launched[0].started_at or launched[0].created_at) * 1000)
        last_ms = int((launched[-1].started_at or launched[-1].created_at) * 1000)
        for host in _hosts(record.job):
            stream = stream_name(record, host)
            if stream.startswith(prefix):
                streams.append(
                    {
                        "logStreamName": stream,
                        "creationTime": first_ms,
                        "firstEventTimestamp": first_ms,
                        "lastEventTimestamp": last_ms,
                        "lastIngestionTime": int(call.now * 1000),
                        "arn": f"arn:aws:logs:{call.region}:{mapping.account_id(call.who.tenant)}:log-group:"
                        f"{mapping.TRAINING_LOG_GROUP}:log-stream:{stream}",
                        "storedBytes": 0,
                    }
                )
    if body.get("orderBy") == "LastEventTime":
        streams.sort(key=lambda s: (s["lastEventTimestamp"], s["logStreamName"]))
    else:
        streams.sort(key=lambda s: s["logStreamName"])
    if body.get("descending"):
        streams.reverse()
    start = 0
    if body.get("nextToken"):
        try:
            start = int(body["nextToken"])
        except ValueError:
            raise validation("The specified nextToken is invalid.") from None
    out: dict[str, Any] = {"logStreams": streams[start : start + limit]}
    if start + limit < len(streams):
        out["nextToken"] = str(start + limit)
    return out


@operation("GetLogEvents")
def get_log_events(call: Call, body: dict[str, Any]) -> dict[str, Any]:
    _group(body)
    match = _STREAM.match(str(body.get("logStreamName") or ""))
    missing = AwsError(LOGS_RESOURCE_NOT_FOUND, "The specified log stream does not exist.")
    if not match:
        raise missing
    name, host, _epoch = match.groups()
    try:
        record = repo.get_sagemaker_job(
            call.session, call.who.tenant, mapping.training_job_arn(call.region, call.who.tenant, name)
        )
    except repo.NotFound:
        raise missing from None
    job = record.job
    if body["logStreamName"] != stream_name(record, host) or host not in _hosts(job):
        raise missing
    backend = call.backends.get(job.backend)
    attempts = _launched(job)
    if backend is None or not attempts:
        return {"events": [], "nextForwardToken": "f/0/0", "nextBackwardToken": "b/0/0"}
    limit = body.get("limit", 10000)
    if not isinstance(limit, int) or not 1 <= limit <= 10000:
        raise validation("limit must be between 1 and 10000")
    reader = _Reader(backend, attempts, host, call.now)
    token = body.get("nextToken")
    if token:
        parsed = _TOKEN.match(str(token))
        if not parsed:
            raise validation("The specified nextToken is invalid.")
        direction, index, offset = parsed.group(1), int(parsed.group(2)), int(parsed.group(3))
        index = min(max(index, 0), len(attempts) - 1)
        if direction == "f":
            return reader.forward(index, max(offset, 0), limit, body)
        return reader.backward(index, max(offset, 0), limit, body)
    if body.get("startFromHead"):
        return reader.forward(0, 0, limit, body)
    return reader.tail(limit, body)


class _Reader:
    """One host's lines across the job's attempts, read through the backend's logs()."""

    def __init__(self, backend, attempts: list, host: str, now: float):
        self.backend = backend
        self.attempts = attempts
        self.host = host
        self.now = now
        # local and Slurm count bytes; the sagemaker backend counts CloudWatch events (lines).
        self.by_lines = getattr(backend, "name", "") == "sagemaker"

    def _read(self, index: int, offset: int, max_bytes: int = CHUNK) -> tuple[str, int]:
        attempt = self.attempts[index]
        try:
            chunk = self.backend.logs(attempt.handle, {self.host: offset}, max_bytes=max_bytes).get(self.host)
        except Exception:
            chunk = None
        return (chunk["text"], int(chunk["offset"])) if chunk else ("", offset)

    def _size(self, line: str) -> int:
        return 1 if self.by_lines else len(line.encode("utf-8")) + 1

    def _event(self, index: int, line: str) -> dict[str, Any]:
        a = self.attempts[index]
        return {
            "timestamp": int((a.started_at or a.created_at) * 1000),
            "message": line,
            "ingestionTime": int(self.now * 1000),
        }

    def _keep(self, event: dict[str, Any], body: dict[str, Any]) -> bool:
        start, end = body.get("startTime"), body.get("endTime")
        return (start is None or event["timestamp"] >= start) and (end is None or event["timestamp"] < end)

    def forward(self, index: int, offset: int, limit: int, body: dict[str, Any]) -> dict[str, Any]:
        start = (index, offset)
        events: list[dict[str, Any]] = []
        size = 0
        while len(events) < limit and size < MAX_RESPONSE_BYTES:
            text, _end = self._read(index, offset)
            if not text:
                if index + 1 < len(self.attempts):
                    index, offset = index + 1, 0
                    continue
                break
            lines = text.split("\n")
            complete, partial = lines[:-1], lines[-1]
            if partial and self.attempts[index].state in TERMINAL and len(text.encode()) < CHUNK:
                complete.append(partial)  # the attempt is over: its last line will not grow
            taken = 0
            for line in complete:
                if len(events) >= limit:
                    break
                event = self._event(index, line)
                if self._keep(event, body):
                    events.append(event)
                    size += len(line) + 26
                offset += self._size(line)
                taken += 1
            if taken == 0:
                break  # only the start of a line still being written
        return {
            "events": events,
            "nextForwardToken": f"f/{index}/{offset}",
            "nextBackwardToken": f"b/{start[0]}/{start[1]}",
        }

    def backward(self, index: int, offset: int, limit: int, body: dict[str, Any]) -> dict[str, Any]:
        """The lines before a position, within its attempt (enough for paging back a little)."""
        begin = max(0, offset - CHUNK) if not self.by_lines else max(0, offset - limit)
        text, _ = self._read(index, begin, max_bytes=max(offset - begin, 1) if not self.by_lines else CHUNK)
        lines = text.split("\n")
        if not self.by_lines:
            lines = lines[:-1] if text.endswith("\n") else lines
            if begin > 0 and lines:
                begin += self._size(lines[0])  # the first line is cut: start after it
                lines = lines[1:]
        else:
            lines = lines[: offset - begin]
        lines = lines[-limit:]
        first = offset - sum(self._size(line) for line in lines)
        events = [e for e in (self._event(index, line) for line in lines) if self._keep(e, body)]
        return {"events": events, "nextForwardToken": f"f/{index}/{offset}", "nextBackwardToken": f"b/{index}/{first}"}

    def tail(self, limit: int, body: dict[str, Any]) -> dict[str, Any]:
        """Without a token and not from the head: the newest lines (CloudWatch's default)."""
        index = len(self.attempts) - 1
        _, end = self._read(index, -1)
        return self.backward(index, end, limit, body)
