"""Fixtures of the whole-job tests."""

from __future__ import annotations

import pytest

from orchestrator.harness.control_plane import ControlPlane


@pytest.fixture
def s3_plane(tmp_path):
    """A control plane of its own (local backend) with the loopback S3 server, nodes cleaned up after."""
    home = tmp_path / "home"
    home.mkdir()
    plane = ControlPlane(home, s3=True).start()
    yield plane
    plane.stop()
    plane.cleanup_nodes()
