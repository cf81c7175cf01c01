"""The CloudWatch Logs calls the SageMaker SDKs read a training job's output with, served from
Aerie's node logs: `DescribeLogStreams`, `GetLogEvents` and `FilterLogEvents` on the log group
SageMaker uses, `/aws/sagemaker/TrainingJobs`.

The SDK's `wait(logs=True)` (2.x and 3.x) lists the streams under the job's prefix until there is
one per instance, then pages through each with GetLogEvents' forward tokens. What a stream is and
how its lines are read: `log_streams`. GetLogEvents' tokens are `f/<attempt>/<offset>` and
`b/<attempt>/<offset>`: positions in the backend's own offsets (bytes on local and Slurm).

`FilterLogEvents` (what `aws logs filter-log-events`, boto3's `filter_log_events` paginator and
AWS CLI v2's `aws logs tail` call) searches those streams together: its request and token are
`log_filter_query`'s, the order it goes through the lines `log_filter_scan`'s, the patterns it
serves `log_filter_patterns`'. A page holds at most 10,000 events and about 1 MB, and stops early
after scanning 16 MiB without filling up (CloudWatch also returns short or empty pages with a
token); no `nextToken` means every line there was when the page was read has been searched.
`searchedLogStreams` is empty, as CloudWatch has returned it since 2020. `startFromHead: false`
(newest first) is refused with InvalidParameterException; `unmask` is accepted (nothing is masked
here).
"""

from __future__ import annotations

import re
from typing import Any

from aerie_contracts import sagemaker_api as contract
from orchestrator import sagemaker_answers as answers
from orchestrator.sagemaker_api.call import Call, registry
from orchestrator.sagemaker_api.errors import LOGS_RESOURCE_NOT_FOUND, AwsError, validation
from orchestrator.sagemaker_api.log_filter_query import FilterQuery, decode_token, encode_token
from orchestrator.sagemaker_api.log_filter_scan import event_id, scan, search_segments
from orchestrator.sagemaker_api.log_streams import (
    MAX_RESPONSE_BYTES,
    Reader,
    job_hosts,
    launched_attempts,
    stream_name,
)
from orchestrator.store import repo

OPERATIONS, operation = registry()
_TOKEN = re.compile(r"^([fb])/(\d+)/(-?\d+)$")
_STREAM = re.compile(r"^([^/]+)/(.+)-(\d+)$")
# A FilterLogEvents page stops after looking at this much (then a token). Read here, at call
# time, so that a test can lower it.
FILTER_SCAN_BYTES = 16 << 20


def _group(body: dict[str, Any]) -> None:
    group = body.get("logGroupName") or body.get("logGroupIdentifier")
    if group != contract.TRAINING_LOG_GROUP:
        raise AwsError(LOGS_RESOURCE_NOT_FOUND, "The specified log group does not exist.")


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
        launched = launched_attempts(record.job)
        if not launched:
            continue  # a stream exists once its node has started writing
        first_ms = int((launched[0].started_at or launched[0].created_at) * 1000)
        last_ms = int((launched[-1].started_at or launched[-1].created_at) * 1000)
        for host in job_hosts(record.job):
            stream = stream_name(record, host)
            if stream.startswith(prefix):
                streams.append(
                    {
                        "logStreamName": stream,
                        "creationTime": first_ms,
                        "firstEventTimestamp": first_ms,
                        "lastEventTimestamp": last_ms,
                        "lastIngestionTime": int(call.now * 1000),
                        "arn": f"arn:aws:logs:{call.region}:{answers.account_id(call.who.tenant)}:log-group:"
                        f"{contract.TRAINING_LOG_GROUP}:log-stream:{stream}",
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
            call.session, call.who.tenant, answers.training_job_arn(call.region, call.who.tenant, name)
        )
    except repo.NotFound:
        raise missing from None
    job = record.job
    if body["logStreamName"] != stream_name(record, host) or host not in job_hosts(job):
        raise missing
    backend = call.backends.get(job.backend)
    attempts = launched_attempts(job)
    if backend is None or not attempts:
        return {"events": [], "nextForwardToken": "f/0/0", "nextBackwardToken": "b/0/0"}
    limit = body.get("limit", 10000)
    if not isinstance(limit, int) or not 1 <= limit <= 10000:
        raise validation("limit must be between 1 and 10000")
    reader = Reader(backend, attempts, host, call.now)
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


@operation("FilterLogEvents")
def filter_log_events(call: Call, body: dict[str, Any]) -> dict[str, Any]:
    query = FilterQuery.parse(call, body)
    segments = search_segments(call, query)
    first, offset = 0, 0
    if body.get("nextToken") is not None:
        key, offset = decode_token(body["nextToken"], query.digest)
        while first < len(segments) and segments[first].key < key:
            first += 1
        if first == len(segments) or segments[first].key != key:
            offset = 0  # that segment is gone (or a new one sorts first): the next one from its start
    events: list[dict[str, Any]] = []
    size = scanned = 0
    out: dict[str, Any] = {"events": events, "searchedLogStreams": []}
    for segment, line, before in scan(segments, first, offset):
        if len(events) >= query.limit or size >= MAX_RESPONSE_BYTES or scanned >= FILTER_SCAN_BYTES:
            out["nextToken"] = encode_token(segment.key, before, query.digest)
            break
        scanned += len(line) + 1
        if query.match(line):
            event = segment.reader.event(segment.index, line)
            events.append(
                {
                    "logStreamName": segment.stream,
                    "timestamp": event["timestamp"],
                    "message": line,
                    "ingestionTime": event["ingestionTime"],
                    "eventId": event_id(segment.key, before),
                }
            )
            size += len(line.encode("utf-8")) + 26
    return out
