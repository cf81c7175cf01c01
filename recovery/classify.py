"""Is a failure retried at all? The policy table of `aerie_contracts.failures`, and the spec's
`retry.non_retryable_exit_codes` for an exit code that was not a signal. (A NaN that recurs after
a deterministic resume is not retried either: `recovery.nan_replay`.)"""

from __future__ import annotations

from typing import Any

from aerie_contracts.failures import FailureKind, policy

RETRY = "retry"


def classify(reason: dict[str, Any], spec: dict[str, Any]) -> str:
    """`RETRY`, or why not."""
    kind = reason.get("kind") or FailureKind.EXIT_NONZERO.value
    rule = policy(kind)
    if rule is None:
        return f"failure kind {kind!r} is not a known kind"
    if rule.user_error:
        return f"the job's input or code is wrong ({kind})"
    if kind == FailureKind.EXIT_NONZERO and not reason.get("signal"):
        code = reason.get("exit_code")
        if code in set(spec.get("retry", {}).get("non_retryable_exit_codes", [])):
            return f"exit code {code} is marked non-retryable in retry.non_retryable_exit_codes"
    if not rule.retry:
        return f"failure kind {kind!r} is not retryable ({rule.meaning})"
    return RETRY
