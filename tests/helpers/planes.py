"""A real control plane (`aerie up`) in a fresh home for the length of a test."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from orchestrator.harness.control_plane import ControlPlane


@contextmanager
def running_control_plane(home: Path, **kwargs) -> Iterator[ControlPlane]:
    """`ControlPlane(home, **kwargs)`, started in `home` (made here); afterwards it is stopped and
    the nodes it launched are cleaned up."""
    home.mkdir()
    plane = ControlPlane(home, **kwargs).start()
    try:
        yield plane
    finally:
        plane.stop()
        plane.cleanup_nodes()
