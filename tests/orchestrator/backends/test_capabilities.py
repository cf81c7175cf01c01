"""Each backend's declared capabilities (aerie_contracts.backends) match the verbs it implements,
and `Backend.start` takes the in-place verb only where the request asks and the backend can."""

from __future__ import annotations

import pytest

from aerie_contracts.backends import CAPABILITIES, capabilities
from orchestrator.backends.base import Backend
from orchestrator.backends.local import LocalBackend
from orchestrator.backends.sagemaker import SageMakerBackend
from orchestrator.backends.slurm import SlurmBackend

BACKENDS = (LocalBackend, SlurmBackend, SageMakerBackend)


def _overrides(cls: type, verb: str) -> bool:
    return getattr(cls, verb) is not getattr(Backend, verb)


@pytest.mark.parametrize("cls", BACKENDS, ids=lambda c: c.name)
def test_declared_capabilities_match_the_verbs(cls):
    caps = CAPABILITIES[cls.name]
    assert caps.in_place == _overrides(cls, "restart_in_place")
    assert caps.chaos == _overrides(cls, "chaos")
    assert caps.add_spares == _overrides(cls, "add_spares")
    assert caps.hot_spares or not caps.add_spares  # adding spares implies having them


def test_every_declared_backend_exists_and_an_unknown_one_can_do_nothing_more():
    assert set(CAPABILITIES) == {cls.name for cls in BACKENDS}
    assert not any(vars(capabilities("mainframe")).values())


class _Recorder(Backend):
    def __init__(self, name: str, warm: dict | None):
        self.name, self.warm, self.calls = name, warm, []

    def launch(self, request):
        self.calls.append("launch")
        return {"new": True}

    def restart_in_place(self, request):
        self.calls.append("restart_in_place")
        return self.warm

    poll = stop = logs = None  # type: ignore[assignment]


class _Request:
    def __init__(self, in_place_of):
        self.in_place_of = in_place_of


@pytest.mark.parametrize(
    ("name", "in_place_of", "warm", "calls"),
    [
        ("local", None, {"warm": True}, ["launch"]),  # a relaunch
        ("local", {"root": "x"}, {"warm": True}, ["restart_in_place"]),
        ("local", {"root": "x"}, None, ["restart_in_place", "launch"]),  # the nodes went away meanwhile
        ("mainframe", {"root": "x"}, {"warm": True}, ["launch"]),  # cannot restart in place
    ],
)
def test_start_restarts_in_place_only_where_asked_and_possible(name, in_place_of, warm, calls):
    backend = _Recorder(name, warm)
    backend.start(_Request(in_place_of))  # type: ignore[arg-type]
    assert backend.calls == calls
