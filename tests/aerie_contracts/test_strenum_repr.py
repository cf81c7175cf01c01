"""Log lines never show an enum's Python repr: a failure reason, a verdict or any dict holding
contract enums logs as its JSON reads (`'kind': 'silent.hang'`, not
`'kind': <FailureKind.SILENT_HANG: 'silent.hang'>`), as the node agent's "node ... finished" line
logs its exit reason (agent/supervisor.py)."""

from __future__ import annotations

import importlib
import json
import logging
import pkgutil

import aerie_contracts
from aerie_contracts import failures
from aerie_contracts._strenum import StrEnum
from aerie_contracts.failures import FailureKind
from aerie_contracts.states import JobState


def _every_strenum() -> list[type[StrEnum]]:
    for mod in pkgutil.iter_modules(aerie_contracts.__path__):
        importlib.import_module(f"aerie_contracts.{mod.name}")
    return StrEnum.__subclasses__()


def test_a_member_reprs_as_its_value():
    assert repr(FailureKind.SILENT_HANG) == "'silent.hang'"
    assert repr({"kind": FailureKind.SILENT_HANG}) == "{'kind': 'silent.hang'}"
    assert str([JobState.FAILED]) == "['Failed']"
    # Still the enum member everywhere else.
    assert FailureKind("silent.hang") is FailureKind.SILENT_HANG
    assert isinstance(FailureKind.SILENT_HANG, FailureKind)
    assert json.dumps({"kind": FailureKind.SILENT_HANG}) == '{"kind": "silent.hang"}'


def test_no_contract_enum_shows_its_python_repr():
    enums = _every_strenum()
    assert FailureKind in enums and JobState in enums and len(enums) > 10
    for cls in enums:
        for member in cls:
            assert repr(member) == repr(member.value), (cls, member)
            assert "<" not in repr({"k": member}) and cls.__name__ not in repr([member])


def test_a_logged_failure_reason_reads_as_its_json(caplog):
    log = logging.getLogger("aerie.test")
    reason = {"kind": FailureKind.SILENT_HANG, "host": "algo-1", "message": "no step for 15s"}
    with caplog.at_level(logging.INFO, logger="aerie.test"):
        log.info("node %s finished: exit %s %s", "algo-1", 1, reason)
        log.info("stopped: %s", failures.stopped_on_request(host="algo-2"))
    text = caplog.text
    assert "'kind': 'silent.hang'" in text and "'kind': 'user.stop'" in text, text
    assert "FailureKind" not in text and "<" not in text, text
