"""A real control plane (`aerie up`) in a fresh home for the length of a test."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from devtools.harness.control_plane import ControlPlane


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


@contextmanager
def netns_plane(home: Path) -> Iterator[ControlPlane]:
    """`running_control_plane` for jobs whose local nodes each get a network namespace of their own
    (`backend_options: {netns: true}`): listening beyond loopback, as the agents inside reach the
    API through the bridge. Needs root and `ip netns` (CI runs as root): without them the test
    fails and says why, it does not skip."""
    import pytest

    from orchestrator.backends import netns

    ok, why = netns.available()
    if not ok:
        pytest.fail(f"network namespaces are unavailable here: {why}")
    with running_control_plane(home, host="0.0.0.0") as plane:
        yield plane
