"""A `str` enum that prints and formats as its value on every supported Python (3.10+).

`enum.StrEnum` exists only from 3.11, and a plain `(str, Enum)` formats as `Class.MEMBER` in
f-strings on 3.12+; members of this one are interchangeable with their string values in JSON,
SQL, f-strings and comparisons, which is what a wire contract needs.

Their repr is the value's too (`'silent.hang'`, not `<FailureKind.SILENT_HANG: 'silent.hang'>`):
a dict, list or dataclass holding members (a failure reason, a verdict) logs as its JSON reads.
"""

from __future__ import annotations

import enum


class StrEnum(str, enum.Enum):
    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)

    def __repr__(self) -> str:
        return repr(str(self.value))

    @classmethod
    def values(cls) -> frozenset[str]:
        return frozenset(m.value for m in cls)
