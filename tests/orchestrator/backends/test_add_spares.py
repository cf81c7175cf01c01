"""`Backend.add_spares`: the local backend starts more hot spares beside a running attempt on its
pool's free slots (real stand-in agent processes, as in test_local_spares.py), idempotent per
handle; a count it cannot place is refused clearly, and backends without the verb say so."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.backends.sagemaker import SageMakerBackend
from orchestrator.backends.slurm import SlurmBackend
from tests.orchestrator.backends.test_local_spares import _kill, _request, agents, backend  # noqa: F401


def test_added_spares_join_the_handle_and_a_repeated_call_starts_nothing(backend):  # noqa: F811
    request = _request(1, slots=6)
    handle = backend.start(request)
    assert handle["spares"] == ["algo-3"]
    backend.spawned.clear()

    grown = backend.add_spares(request, handle, 2)
    assert grown["spares"] == ["algo-3", "algo-4", "algo-5"] and grown["spares_added"] == 1
    assert {"algo-4", "algo-5"} <= set(grown["memory_peers"])
    assert backend.spawned == [(1, "algo-4", True), (1, "algo-5", True)]
    assert backend.add_spares(request, handle, 2) == grown and len(backend.spawned) == 2  # same handle: once
    assert backend.add_spares(request, grown, 0) is grown

    with pytest.raises(ValueError, match="1 free slot"):
        backend.add_spares(request, grown, 2)
    with pytest.raises(ValueError, match="0 or more"):
        backend.add_spares(request, grown, -1)

    _kill(Path(grown["root"]) / "algo-4")  # an added spare that dies is replaced like any other
    assert backend.poll(grown).spares_replaced == {"algo-4": "algo-6"}


@pytest.mark.parametrize("cls", [SlurmBackend, SageMakerBackend], ids=lambda c: c.name)
def test_a_backend_that_cannot_add_spares_says_so(cls, tmp_path):
    other = cls.__new__(cls)
    with pytest.raises(NotImplementedError, match=f"the {cls.name} backend cannot add hot spares"):
        other.add_spares(_request(1), {"root": str(tmp_path)}, 1)
