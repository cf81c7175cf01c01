"""CloudWatch Logs filter patterns for unstructured events, as FilterLogEvents serves them.

They match case-sensitively as substrings of the message (as CloudWatch does: `error` matches
"errors"):
- empty (or only spaces): every event;
- `ERROR Exception`: every term must appear; `"out of memory"`: the exact phrase, quotes needed
  for any term with characters other than letters, digits and `_`;
- `ERROR -heartbeat`: with a `-` term, events with that term are left out;
- `?ERROR ?WARN`: any of the `?` terms (a pattern is either all `?` terms or none);
- `%regex%`: one regular expression in CloudWatch's documented subset (letters, digits,
  `:_#=@/;,-` and space, operators `^$?[]{}|*+.` and backslash; no parentheses), searched in the message.
JSON (`{ $.x = ... }`) and space-delimited (`[w1, w2]`) patterns, and anything else, answer
InvalidParameterException naming what is not served, rather than matching something else.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from orchestrator.sagemaker_api.errors import invalid_parameter

_BARE_TERM = re.compile(r"[A-Za-z0-9_]+")
_REGEX_ALLOWED = re.compile(r"[A-Za-z0-9:_#=@/;,\- ^$?\[\]{}|\\*+.]+")


def compile_filter_pattern(pattern: str) -> Callable[[str], bool]:
    """A CloudWatch filter pattern for unstructured events (the subset in the module's docstring)
    as a predicate on a message; InvalidParameterException for what it does not serve."""
    text = pattern.strip()
    if not text:
        return lambda message: True
    if text.startswith("{"):
        raise invalid_parameter("JSON filter patterns ({ $.field ... }) are not supported by this endpoint; use terms.")
    if text.startswith("["):
        raise invalid_parameter("Space-delimited filter patterns ([w1, w2, ...]) are not supported by this endpoint.")
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
                raise invalid_parameter(f"Invalid filter pattern {pattern!r}: a double quote is not closed.")
            term, i = text[i + 1 : close], close + 1
            if i < n and not text[i].isspace():
                raise invalid_parameter(
                    f"Invalid filter pattern {pattern!r}: a quoted term must be followed by a space."
                )
            if not term:
                raise invalid_parameter(f"Invalid filter pattern {pattern!r}: an empty quoted term.")
        else:
            end = i
            while end < n and not text[end].isspace():
                end += 1
            term, i = text[i:end], end
            if not _BARE_TERM.fullmatch(term):
                raise invalid_parameter(
                    f"Unsupported filter pattern term {op + term!r}: terms with characters other than letters, "
                    'digits and _ must be in double quotes ("..."); regular expressions go in %...%.'
                )
        {"": includes, "-": excludes, "?": anyof}[op].append(term)
    if anyof and (includes or excludes):
        raise invalid_parameter(
            f"Unsupported filter pattern {pattern!r}: ?-terms (any of) cannot be mixed with other terms here."
        )
    if anyof:
        return lambda message: any(term in message for term in anyof)
    return lambda message: all(t in message for t in includes) and not any(t in message for t in excludes)


def _regex(text: str) -> Callable[[str], bool]:
    if len(text) < 3 or not text.endswith("%") or "%" in text[1:-1]:
        raise invalid_parameter(f"Unsupported filter pattern {text!r}: a regular expression is one %...% alone.")
    body = text[1:-1]
    if not _REGEX_ALLOWED.fullmatch(body):
        raise invalid_parameter(
            f"Invalid filter pattern {text!r}: a regular expression may hold only letters, digits, "
            "the symbols :_#=@/;,- and space, and the operators ^$?[]{}|\\*+. (no parentheses)."
        )
    try:
        compiled = re.compile(body, re.ASCII)
    except re.error as exc:
        raise invalid_parameter(f"Invalid filter pattern {text!r}: {exc}.") from None
    return lambda message: compiled.search(message) is not None
