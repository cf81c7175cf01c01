"""`EnvVar` and `ALL`, the registry `aerie_contracts/env_names.py` defines every name into.

Apart from `aerie_contracts.env` so that the names can register without importing `env` (which
imports them): `ALL` fills in definition order, the order of the documented table.
"""

from __future__ import annotations

import os
from collections.abc import Mapping


class EnvVar(str):
    """An environment variable's name, with its meaning and its writers and readers."""

    meaning: str
    set_by: str
    read_by: str

    def __new__(cls, name: str, meaning: str, set_by: str, read_by: str) -> EnvVar:
        obj = super().__new__(cls, name)
        obj.meaning, obj.set_by, obj.read_by = meaning, set_by, read_by
        return obj

    @property
    def name(self) -> str:
        return str.__str__(self)

    def get(self, default: str | None = None, environ: Mapping[str, str] | None = None) -> str | None:
        return (os.environ if environ is None else environ).get(self, default)


ALL: list[EnvVar] = []


def define(name: str, meaning: str, set_by: str, read_by: str) -> EnvVar:
    """A new variable, registered in `ALL`."""
    var = EnvVar(name, meaning, set_by, read_by)
    ALL.append(var)
    return var
