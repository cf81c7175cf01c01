"""Requests checked against botocore's own service model, as AWS validates them.

One rule for every enum-typed field: walk the request along its operation's input shape
(structures, lists, maps) and refuse a string whose shape has an `enum` unless it holds one of
its values. No list per field: a member AWS adds to the model is checked once botocore ships it.
Messages are AWS's JSON-protocol validation messages, with AWS's field paths: each segment
lowerCamelCased, list members as `<list>.<1-based index>.member`:

    1 validation error detected: Value 'Bogus' at 'algorithmSpecification.trainingInputMode'
    failed to satisfy constraint: Member must satisfy enum value set: [Pipe, File, FastFile]

A list of enum strings is reported at the list (`Member must satisfy constraint: [...]`), a map's
keys and values at the map (`Map keys must satisfy constraint: [...]`), as AWS reports them.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any

from orchestrator.sagemaker_api.errors import AwsError, validation


@functools.cache
def service_model(service: str) -> Any:
    """botocore's model of `service` (loaded once: it is a few MiB of JSON)."""
    import botocore.session

    return botocore.session.get_session().get_service_model(service)


def input_shape(service: str, operation: str) -> Any:
    return service_model(service).operation_model(operation).input_shape


def aws_name(member: str) -> str:
    """A member as AWS's field paths write it: `S3DataSource` -> `s3DataSource`."""
    return member[:1].lower() + member[1:]


def aws_path(segments: Iterable[Any]) -> str:
    """AWS's path of a field: members lowerCamelCased, list indexes (0-based ints) as `N.member`."""
    parts: list[str] = []
    for s in segments:
        if isinstance(s, int) and not isinstance(s, bool):
            parts += [str(s + 1), "member"]
        else:
            parts.append(aws_name(str(s)))
    return ".".join(parts)


def _shown(value: Any) -> str:
    """A value as AWS's messages quote it (Java's toString: `[a, b]`, `{k=v}`)."""
    if isinstance(value, list):
        return "[" + ", ".join(_shown(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_shown(k)}={_shown(v)}" for k, v in value.items()) + "}"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def _enum_rule(shape: Any) -> str:
    return f"Member must satisfy enum value set: [{', '.join(shape.enum)}]"


def _is_enum(shape: Any) -> bool:
    return shape.type_name == "string" and bool(getattr(shape, "enum", None))


def _bad(shape: Any, value: Any) -> bool:
    return _is_enum(shape) and value not in shape.enum


def constraint_message(value: Any, path: str, rule: str) -> str:
    """One violation, worded as AWS words it."""
    return f"Value '{_shown(value)}' at '{path}' failed to satisfy constraint: {rule}"


def enum_violations(shape: Any, value: Any, path: tuple[Any, ...] = ()) -> list[str]:
    """Every enum-typed field of `value` (a request, or part of one, of `shape`) that holds a value
    outside its shape's enum, as AWS's messages, in the model's member order. Fields of the wrong
    JSON type are skipped here (the request's own checks refuse those)."""
    if value is None:
        return []
    kind = shape.type_name
    if kind == "structure":
        if not isinstance(value, dict):
            return []
        out: list[str] = []
        for name, member in shape.members.items():
            if name in value:
                out += enum_violations(member, value[name], (*path, name))
        return out
    if kind == "list":
        if not isinstance(value, list):
            return []
        member = shape.member
        if _is_enum(member):
            if any(_bad(member, v) for v in value):
                return [
                    constraint_message(value, aws_path(path), f"Member must satisfy constraint: [{_enum_rule(member)}]")
                ]
            return []
        out = []
        for i, item in enumerate(value):
            out += enum_violations(member, item, (*path, i))
        return out
    if kind == "map":
        if not isinstance(value, dict):
            return []
        out = []
        if any(_bad(shape.key, k) for k in value):
            out.append(
                constraint_message(
                    value, aws_path(path), f"Map keys must satisfy constraint: [{_enum_rule(shape.key)}]"
                )
            )
        if _is_enum(shape.value):
            if any(_bad(shape.value, v) for v in value.values()):
                out.append(
                    constraint_message(
                        value, aws_path(path), f"Map value must satisfy constraint: [{_enum_rule(shape.value)}]"
                    )
                )
            return out
        for k, v in value.items():
            out += enum_violations(shape.value, v, (*path, k))
        return out
    if _bad(shape, value):
        return [constraint_message(value, aws_path(path), _enum_rule(shape))]
    return []


def detected(messages: list[str]) -> AwsError:
    """AWS's ValidationException for these violations: `N validation error(s) detected: a; b`."""
    noun = "error" if len(messages) == 1 else "errors"
    return validation(f"{len(messages)} validation {noun} detected: " + "; ".join(messages))


def check_enums(service: str, operation: str, body: dict[str, Any]) -> None:
    """Raise AWS's ValidationException if any enum-typed field of the request is out of its set."""
    messages = enum_violations(input_shape(service, operation), body)
    if messages:
        raise detected(messages)
