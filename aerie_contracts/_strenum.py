"""A `str` enum that prints and formats as its value on every supported Python (3.10+).

`enum.StrEnum` exists only from 3.11, and a plain `(str, Enum)` formats as `Class.MEMBER` in
f-strings on 3.12+; members of this one are interchangeable with their string values in JSON,
SQL, f-strings and comparisons, which is what a wire contract needs.
"""

from __future__ import annotations

import enum


class StrEnum(str, enum.Enum):
    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)

    @classmethod
    def values(cls) -> frozenset[str]:
        return frozenset(m.value for m in cls)
