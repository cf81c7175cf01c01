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

`FilterLogEvents` (what `aws logs filter-log-events`, boto3's `filter_log_events` paginator and
AWS CLI v2's `aws logs tail` call) searches those streams together: the group's streams, or
`logStreamNames` / `logStreamNamePrefix`; `startTime` / `endTime` in ms, both inclusive as
CloudWatch has them; `limit` (at most 10,000 events and about 1 MB a page). Events come
interleaved across streams in timestamp order (CloudWatch ignores `interleaved: false` since
2019, and so does this), ties by stream name then position, so one attempt's lines of algo-1 come
before the same attempt's lines of algo-2. `nextToken` is opaque: the position after the last
line looked at plus a digest of the query, so the same token with the same query resumes at the
same line, and one from another query is refused. A page stops early after scanning 16 MiB
without filling up (CloudWatch also returns short or empty pages with a token); no `nextToken`
means every line there was when the page was read has been searched. `searchedLogStreams` is
empty, as CloudWatch has returned it since 2020.

The filter patterns served are CloudWatch's for unstructured events, matched case-sensitively
as substrings of the message (as CloudWatch does: `error` matches "errors"):
- empty (or only spaces): every event;
- `ERROR Exception`: every term must appear; `"out of memory"`: the exact phrase, quotes needed
  for any term with characters other than letters, digits and `_`;
- `ERROR -heartbeat`: with a `-` term, events with that term are left out;
- `?ERROR ?WARN`: any of the `?` terms (a pattern is either all `?` terms or none);
- `%regex%`: one regular expression in CloudWatch's documented subset (letters, digits,
  `:_#=@/;,-` and space, operators `^$?[]{}|*+.` and backslash; no parentheses), searched in the message.
JSON (`{ $.x = ... }`) and space-delimited (`[w1, w2]`) patterns, and anything else, answer
InvalidParameterException naming what is not served, rather than matching something else.
`startFromHead: false` (newest first) is refused the same way; `unmask` is accepted (nothing is
masked here).
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from aerie_contracts import sagemaker_api as contract
from aerie_contracts.states import ATTEMPT_TERMINAL
from orchestrator import sagemaker_answers as answers
from orchestrator.sagemaker_api.call import Call, registry
from orchestrator.sagemaker_api.errors import LOGS_RESOURCE_NOT_FOUND, AwsError, validation
from orchestrator.store import repo

OPERATIONS, operation = registry()
CHUNK = 256 * 1024
MAX_RESPONSE_BYTES = 1 << 20  # GetLogEvents returns at most 1 MB, as CloudWatch does
_TOKEN = re.compile(r"^([fb])/(\d+)/(-?\d+)$")
_STREAM = re.compile(r"^([^/]+)/(.+)-(\d+)$")
TERMINAL = ATTEMPT_TERMINAL
INVALID_PARAMETER = "InvalidParameterException"  # CloudWatch Logs' modeled error for a bad input
FILTER_SCAN_BYTES = 16 << 20  # a FilterLogEvents page stops after looking at this much (then a token)
JOBS_PAGE = 500


def _group(body: dict[str, Any]) -> None:
    group = body.get("logGroupName") or body.get("logGroupIdentifier")
    if group != contract.TRAINING_LOG_GROUP:
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


def _invalid(message: str) -> AwsError:
    return AwsError(INVALID_PARAMETER, message)


@operation("FilterLogEvents")
def filter_log_events(call: Call, body: dict[str, Any]) -> dict[str, Any]:
    query = _FilterQuery.parse(call, body)
    segments = _segments(call, query)
    first, offset = 0, 0
    if body.get("nextToken") is not None:
        key, offset = _decode_token(body["nextToken"], query.digest)
        while first < len(segments) and segments[first].key < key:
            first += 1
        if first == len(segments) or segments[first].key != key:
            offset = 0  # that segment is gone (or a new one sorts first): the next one from its start
    events: list[dict[str, Any]] = []
    size = scanned = 0
    out: dict[str, Any] = {"events": events, "searchedLogStreams": []}
    for segment, line, before in _scan(segments, first, offset):
        if len(events) >= query.limit or size >= MAX_RESPONSE_BYTES or scanned >= FILTER_SCAN_BYTES:
            out["nextToken"] = _encode_token(segment.key, before, query.digest)
            break
        scanned += len(line) + 1
        if query.match(line):
            event = segment.reader._event(segment.index, line)
            events.append(
                {
                    "logStreamName": segment.stream,
                    "timestamp": event["timestamp"],
                    "message": line,
                    "ingestionTime": event["ingestionTime"],
                    "eventId": _event_id(segment.key, before),
                }
            )
            size += len(line.encode("utf-8")) + 26
    return out


@dataclass(frozen=True)
class _FilterQuery:
    """A FilterLogEvents request, validated: which streams, which times, which lines, how many."""

    names: frozenset[str] | None
    prefix: str
    start: int | None
    end: int | None
    pattern: str
    limit: int
    match: Callable[[str], bool]
    digest: str  # what a token is bound to: the same query, or the token is refused

    @classmethod
    def parse(cls, call: Call, body: dict[str, Any]) -> _FilterQuery:
        _filter_group(call, body)
        names = body.get("logStreamNames")
        prefix = body.get("logStreamNamePrefix")
        if names is not None and prefix is not None:
            raise _invalid("logStreamNames and logStreamNamePrefix cannot both be specified.")
        if names is not None:
            if not isinstance(names, list) or not 1 <= len(names) <= 100:
                raise _invalid("logStreamNames must be a list of 1 to 100 log stream names.")
            if not all(isinstance(n, str) and 1 <= len(n) <= 512 for n in names):
                raise _invalid("Each of logStreamNames must be a string of 1 to 512 characters.")
        if prefix is not None and (not isinstance(prefix, str) or not 1 <= len(prefix) <= 512):
            raise _invalid("logStreamNamePrefix must be a string of 1 to 512 characters.")
        times = {}
        for field in ("startTime", "endTime"):
            value = body.get(field)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise _invalid(f"{field} must be a non-negative number of milliseconds since the epoch.")
            times[field] = value
        start, end = times["startTime"], times["endTime"]
        if start is not None and end is not None and end < start:
            raise _invalid("endTime must be greater than or equal to startTime.")
        limit = body.get("limit", 10000)
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 10000:
            raise _invalid("limit must be between 1 and 10000.")
        pattern = body.get("filterPattern")
        if pattern is None:
            pattern = ""
        if not isinstance(pattern, str) or len(pattern) > 1024:
            raise _invalid("filterPattern must be a string of at most 1024 characters.")
        if body.get("startFromHead") is False:
            raise _invalid("startFromHead=false (newest events first) is not supported by this endpoint.")
        token = body.get("nextToken")
        if token is not None and (not isinstance(token, str) or not token):
            raise _invalid("The specified nextToken is invalid.")
        match = compile_filter_pattern(pattern)
        key = json.dumps([sorted(names) if names is not None else None, prefix, start, end, pattern])
        digest = hashlib.sha256(key.encode()).hexdigest()[:16]
        return cls(
            frozenset(names) if names is not None else None, prefix or "", start, end, pattern, limit, match, digest
        )

    def wants(self, stream: str) -> bool:
        return stream in self.names if self.names is not None else stream.startswith(self.prefix)

    def covers(self, timestamp: int) -> bool:
        return (self.start is None or timestamp >= self.start) and (self.end is None or timestamp <= self.end)


def _filter_group(call: Call, body: dict[str, Any]) -> None:
    """FilterLogEvents names its group by `logGroupName` or `logGroupIdentifier` (a name or an
    ARN), exactly one of them."""
    name, identifier = body.get("logGroupName"), body.get("logGroupIdentifier")
    if name is not None and identifier is not None:
        raise _invalid("logGroupName and logGroupIdentifier cannot both be specified.")
    if name is None and identifier is None:
        raise _invalid("Either logGroupName or logGroupIdentifier must be specified.")
    group = name if name is not None else identifier
    if not isinstance(group, str) or not group:
        raise _invalid("The log group must be a non-empty string.")
    if identifier is not None and group.startswith("arn:"):
        own = f"arn:aws:logs:{call.region}:{answers.account_id(call.who.tenant)}:log-group:"
        group = group[len(own) :].removesuffix(":*") if group.startswith(own) else ""
    if group != contract.TRAINING_LOG_GROUP:
        raise AwsError(LOGS_RESOURCE_NOT_FOUND, "The specified log group does not exist.")


@dataclass(frozen=True)
class _Segment:
    """One attempt's lines of one stream: the unit events are ordered in (all its lines share its
    timestamp, the attempt's start)."""

    key: tuple[int, str, int]  # (timestamp ms, stream name, attempt number): the order, and a token's anchor
    stream: str
    reader: _Reader
    index: int  # the attempt's place in reader.attempts


def _segments(call: Call, query: _FilterQuery) -> list[_Segment]:
    out = []
    for record in _filter_records(call, query):
        job = record.job
        backend = call.backends.get(job.backend)
        attempts = _launched(job)
        if backend is None or not attempts:
            continue
        for host in _hosts(job):
            stream = stream_name(record, host)
            if not query.wants(stream):
                continue
            reader = _Reader(backend, attempts, host, call.now)
            for index, attempt in enumerate(attempts):
                timestamp = int((attempt.started_at or attempt.created_at) * 1000)
                if query.covers(timestamp):
                    out.append(_Segment((timestamp, stream, attempt.number), stream, reader, index))
    out.sort(key=lambda segment: segment.key)
    return out


def _filter_records(call: Call, query: _FilterQuery) -> Iterator:
    """The tenant's SageMaker jobs in this region whose streams the query may name."""
    if query.names is not None:
        for name in sorted({n.split("/", 1)[0] for n in query.names if "/" in n}):
            arn = answers.training_job_arn(call.region, call.who.tenant, name)
            try:
                yield repo.get_sagemaker_job(call.session, call.who.tenant, arn)
            except repo.NotFound:
                continue
        return
    name = query.prefix.split("/", 1)[0] or None
    offset = 0
    while True:
        page = repo.list_sagemaker_jobs(
            call.session, call.who.tenant, call.region, name_prefix=name, limit=JOBS_PAGE, offset=offset
        )
        yield from page
        if len(page) < JOBS_PAGE:
            return
        offset += JOBS_PAGE


def _scan(segments: list[_Segment], first: int, offset: int) -> Iterator[tuple[_Segment, str, int]]:
    """Every complete line from segment `first` at `offset` on: (segment, line, its offset)."""
    for number, segment in enumerate(segments[first:]):
        before = offset if number == 0 else 0
        for line, after in segment.reader.lines(segment.index, before):
            yield segment, line, before
            before = after


def _encode_token(key: tuple[int, str, int], offset: int, digest: str) -> str:
    raw = json.dumps({"v": 1, "q": digest, "k": list(key), "o": offset}, separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def _decode_token(token: str, digest: str) -> tuple[tuple[int, str, int], int]:
    try:
        raw = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        timestamp, stream, number = raw["k"]
        key = (int(timestamp), str(stream), int(number))
        offset = int(raw["o"])
        ok = raw["v"] == 1 and offset >= 0
    except (ValueError, TypeError, KeyError, AttributeError):
        raise _invalid("The specified nextToken is invalid.") from None
    if not ok:
        raise _invalid("The specified nextToken is invalid.")
    if raw["q"] != digest:
        raise _invalid("The specified nextToken belongs to another query: repeat that query's parameters with it.")
    return key, offset


def _event_id(key: tuple[int, str, int], offset: int) -> str:
    """A stable id of one line (its stream, attempt and position), in CloudWatch's 56-digit form."""
    digest = hashlib.sha256(f"{key[1]}\0{key[2]}\0{offset}".encode()).digest()
    return str(int.from_bytes(digest, "big")).zfill(78)[:56]


# --- filter patterns --------------------------------------------------------------------------------

_BARE_TERM = re.compile(r"[A-Za-z0-9_]+")
_REGEX_ALLOWED = re.compile(r"[A-Za-z0-9:_#=@/;,\- ^$?\[\]{}|\\*+.]+")


def compile_filter_pattern(pattern: str) -> Callable[[str], bool]:
    """A CloudWatch filter pattern for unstructured events (the subset in the module's docstring)
    as a predicate on a message; InvalidParameterException for what it does not serve."""
    text = pattern.strip()
    if not text:
        return lambda message: True
    if text.startswith("{"):
        raise _invalid("JSON filter patterns ({ $.field ... }) are not supported by this endpoint; use terms.")
    if text.startswith("["):
        raise _invalid("Space-delimited filter patterns ([w1, w2, ...]) are not supported by this endpoint.")
    if text.startswith("%"):
        return _regex(text)
    includes, excludes, anyof = [], [], []
    i, n = 0, len(text)
    while i < n:
        if text[i].isspace():
            i += 1
            continue
        op = text[i] if text[i] in "?-" else ""
        i += len(op)
        if i < n and text[i] == '"':
            close = text.find('"', i + 1)
            if close < 0:
                raise _invalid(f"Invalid filter pattern {pattern!r}: a double quote is not closed.")
            term, i = text[i + 1 : close], close + 1
            if i < n and not text[i].isspace():
                raise _invalid(f"Invalid filter pattern {pattern!r}: a quoted term must be followed by a space.")
            if not term:
                raise _invalid(f"Invalid filter pattern {pattern!r}: an empty quoted term.")
        else:
            end = i
            while end < n and not text[end].isspace():
                end += 1
            term, i = text[i:end], end
            if not _BARE_TERM.fullmatch(term):
                raise _invalid(
                    f"Unsupported filter pattern term {op + term!r}: terms with characters other than letters, "
                    'digits and _ must be in double quotes ("..."); regular expressions go in %...%.'
                )
        {"": includes, "-": excludes, "?": anyof}[op].append(term)
    if anyof and (includes or excludes):
        raise _invalid(
            f"Unsupported filter pattern {pattern!r}: ?-terms (any of) cannot be mixed with other terms here."
        )
    if anyof:
        return lambda message: any(term in message for term in anyof)
    return lambda message: all(t in message for t in includes) and not any(t in message for t in excludes)


def _regex(text: str) -> Callable[[str], bool]:
    if len(text) < 3 or not text.endswith("%") or "%" in text[1:-1]:
        raise _invalid(f"Unsupported filter pattern {text!r}: a regular expression is one %...% alone.")
    body = text[1:-1]
    if not _REGEX_ALLOWED.fullmatch(body):
        raise _invalid(
            f"Invalid filter pattern {text!r}: a regular expression may hold only letters, digits, "
            "the symbols :_#=@/;,- and space, and the operators ^$?[]{}|\\*+. (no parentheses)."
        )
    try:
        compiled = re.compile(body, re.ASCII)
    except re.error as exc:
        raise _invalid(f"Invalid filter pattern {text!r}: {exc}.") from None
    return lambda message: compiled.search(message) is not None


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

    def lines(self, index: int, offset: int) -> Iterator[tuple[str, int]]:
        """Attempt `index`'s complete lines from `offset` on, each with the offset after it (the
        same rule as forward(): a running attempt's unfinished last line waits until it is whole)."""
        while True:
            text, _end = self._read(index, offset)
            if not text:
                return
            lines = text.split("\n")
            complete, partial = lines[:-1], lines[-1]
            if partial and self.attempts[index].state in TERMINAL and len(text.encode()) < CHUNK:
                complete.append(partial)
            if not complete:
                return  # only the start of a line still being written
            for line in complete:
                offset += self._size(line)
                yield line, offset

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
