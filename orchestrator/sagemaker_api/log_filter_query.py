"""A FilterLogEvents request, validated, and the `nextToken` that resumes it.

The request names the group's streams (all, `logStreamNames` or `logStreamNamePrefix`), a time
window (`startTime` / `endTime` in ms, both inclusive as CloudWatch has them), a filter pattern
and a `limit` (at most 10,000 events). The token is opaque: the position after the last line
looked at plus a digest of the query, so the same token with the same query resumes at the same
line, and one from another query is refused.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aerie_contracts import sagemaker_api as contract
from orchestrator import sagemaker_answers as answers
from orchestrator.sagemaker_api.call import Call
from orchestrator.sagemaker_api.errors import LOGS_RESOURCE_NOT_FOUND, AwsError, invalid_parameter
from orchestrator.sagemaker_api.log_filter_patterns import compile_filter_pattern


@dataclass(frozen=True)
class FilterQuery:
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
    def parse(cls, call: Call, body: dict[str, Any]) -> FilterQuery:
        check_group(call, body)
        names = body.get("logStreamNames")
        prefix = body.get("logStreamNamePrefix")
        if names is not None and prefix is not None:
            raise invalid_parameter("logStreamNames and logStreamNamePrefix cannot both be specified.")
        if names is not None:
            if not isinstance(names, list) or not 1 <= len(names) <= 100:
                raise invalid_parameter("logStreamNames must be a list of 1 to 100 log stream names.")
            if not all(isinstance(n, str) and 1 <= len(n) <= 512 for n in names):
                raise invalid_parameter("Each of logStreamNames must be a string of 1 to 512 characters.")
        if prefix is not None and (not isinstance(prefix, str) or not 1 <= len(prefix) <= 512):
            raise invalid_parameter("logStreamNamePrefix must be a string of 1 to 512 characters.")
        times = {}
        for field in ("startTime", "endTime"):
            value = body.get(field)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise invalid_parameter(f"{field} must be a non-negative number of milliseconds since the epoch.")
            times[field] = value
        start, end = times["startTime"], times["endTime"]
        if start is not None and end is not None and end < start:
            raise invalid_parameter("endTime must be greater than or equal to startTime.")
        limit = body.get("limit", 10000)
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 10000:
            raise invalid_parameter("limit must be between 1 and 10000.")
        pattern = body.get("filterPattern")
        if pattern is None:
            pattern = ""
        if not isinstance(pattern, str) or len(pattern) > 1024:
            raise invalid_parameter("filterPattern must be a string of at most 1024 characters.")
        if body.get("startFromHead") is False:
            raise invalid_parameter("startFromHead=false (newest events first) is not supported by this endpoint.")
        token = body.get("nextToken")
        if token is not None and (not isinstance(token, str) or not token):
            raise invalid_parameter("The specified nextToken is invalid.")
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


def check_group(call: Call, body: dict[str, Any]) -> None:
    """FilterLogEvents names its group by `logGroupName` or `logGroupIdentifier` (a name or an
    ARN), exactly one of them."""
    name, identifier = body.get("logGroupName"), body.get("logGroupIdentifier")
    if name is not None and identifier is not None:
        raise invalid_parameter("logGroupName and logGroupIdentifier cannot both be specified.")
    if name is None and identifier is None:
        raise invalid_parameter("Either logGroupName or logGroupIdentifier must be specified.")
    group = name if name is not None else identifier
    if not isinstance(group, str) or not group:
        raise invalid_parameter("The log group must be a non-empty string.")
    if identifier is not None and group.startswith("arn:"):
        own = f"arn:aws:logs:{call.region}:{answers.account_id(call.who.tenant)}:log-group:"
        group = group[len(own) :].removesuffix(":*") if group.startswith(own) else ""
    if group != contract.TRAINING_LOG_GROUP:
        raise AwsError(LOGS_RESOURCE_NOT_FOUND, "The specified log group does not exist.")


def encode_token(key: tuple[int, str, int], offset: int, digest: str) -> str:
    raw = json.dumps({"v": 1, "q": digest, "k": list(key), "o": offset}, separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_token(token: str, digest: str) -> tuple[tuple[int, str, int], int]:
    try:
        raw = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        timestamp, stream, number = raw["k"]
        key = (int(timestamp), str(stream), int(number))
        offset = int(raw["o"])
        ok = raw["v"] == 1 and offset >= 0
    except (ValueError, TypeError, KeyError, AttributeError):
        raise invalid_parameter("The specified nextToken is invalid.") from None
    if not ok:
        raise invalid_parameter("The specified nextToken is invalid.")
    if raw["q"] != digest:
        raise invalid_parameter(
            "The specified nextToken belongs to another query: repeat that query's parameters with it."
        )
    return key, offset
