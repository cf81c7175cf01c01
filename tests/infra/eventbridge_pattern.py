"""A small EventBridge event-pattern matcher, to check synthesized rules against sample events.

Why not boto3's `events.test_event_pattern`: it is an API call to AWS, so it needs network and
credentials; nothing here reaches AWS. This matcher implements the documented semantics
(https://docs.aws.amazon.com/eventbridge/latest/userguide/eb-event-patterns.html) that Aerie's
rules can use:

- a pattern is a JSON object; every key in it must match (AND), keys absent from the pattern
  are ignored; nested objects match nested objects;
- a leaf is a list of alternatives (OR); a literal matches by equality (strings are
  case-sensitive, numbers compare numerically); when the event's value is an array, the leaf
  matches if any element matches;
- content filters: `prefix`, `suffix` (optionally `{"equals-ignore-case": ...}` inside them),
  `equals-ignore-case`, `anything-but` (a literal, a list, or a prefix/suffix object),
  `numeric` (operator/value pairs), `exists`, `wildcard`; and `$or` at any level.

Anything else raises ValueError instead of matching silently.
"""

from __future__ import annotations

import operator
import re
from typing import Any

_MISSING = object()
_NUMERIC_OPS = {"=": operator.eq, "<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge}


def matches(pattern: dict, event: dict) -> bool:
    """True when EventBridge would deliver `event` to a rule with `pattern`."""
    if not isinstance(pattern, dict):
        raise ValueError(f"a pattern is an object, got {pattern!r}")
    for key, expected in pattern.items():
        if key == "$or":
            if not any(matches(branch, event) for branch in expected):
                return False
            continue
        value = event.get(key, _MISSING) if isinstance(event, dict) else _MISSING
        if isinstance(expected, dict):
            if not isinstance(value, dict) or not matches(expected, value):
                return False
        elif isinstance(expected, list):
            if not _leaf_matches(expected, value):
                return False
        else:
            raise ValueError(f"pattern values are objects or arrays, got {key}: {expected!r}")
    return True


def _leaf_matches(alternatives: list, value: Any) -> bool:
    for alternative in alternatives:
        if isinstance(alternative, dict) and "exists" in alternative:
            if (value is not _MISSING) == bool(alternative["exists"]):
                return True
            continue
        if value is _MISSING:
            continue
        candidates = value if isinstance(value, list) else [value]
        if any(_one_matches(alternative, item) for item in candidates):
            return True
    return False


def _one_matches(alternative: Any, value: Any) -> bool:
    if not isinstance(alternative, dict):
        return _equal(alternative, value)
    if len(alternative) != 1:
        raise ValueError(f"a content filter has one key: {alternative!r}")
    ((kind, arg),) = alternative.items()
    if kind == "prefix":
        return isinstance(value, str) and _affix(arg, value, str.startswith)
    if kind == "suffix":
        return isinstance(value, str) and _affix(arg, value, str.endswith)
    if kind == "equals-ignore-case":
        return isinstance(value, str) and value.casefold() == str(arg).casefold()
    if kind == "wildcard":
        return (
            isinstance(value, str)
            and re.fullmatch(".*".join(map(re.escape, str(arg).split("*"))), value, re.S) is not None
        )
    if kind == "numeric":
        return _numeric(arg, value)
    if kind == "anything-but":
        if isinstance(arg, dict):
            return not _one_matches(arg, value)
        excluded = arg if isinstance(arg, list) else [arg]
        return not any(_equal(item, value) for item in excluded)
    raise ValueError(f"unsupported content filter {kind!r}")


def _affix(arg: Any, value: str, test) -> bool:
    if isinstance(arg, dict) and set(arg) == {"equals-ignore-case"}:
        return test(value.casefold(), str(arg["equals-ignore-case"]).casefold())
    return test(value, str(arg))


def _numeric(spec: list, value: Any) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if len(spec) % 2:
        raise ValueError(f"numeric filter needs operator/value pairs: {spec!r}")
    return all(_NUMERIC_OPS[op](value, bound) for op, bound in zip(spec[::2], spec[1::2]))


def _equal(expected: Any, value: Any) -> bool:
    if isinstance(expected, bool) or isinstance(value, bool) or expected is None or value is None:
        return expected is value or (expected == value and type(expected) is type(value))
    if isinstance(expected, (int, float)) and isinstance(value, (int, float)):
        return float(expected) == float(value)
    return expected == value
