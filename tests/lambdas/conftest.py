"""Shared fixtures of the Lambda handler tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def api(live_api):
    """Every handler here talks to the control plane over HTTP, as it does in AWS Lambda."""
    return live_api
