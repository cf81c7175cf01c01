"""agent/preflight/shape.py on a real interface: a veth pair made for the test (root, as CI runs)."""

from __future__ import annotations

import os
import subprocess

import pytest

from agent.preflight import shape

IFACE = "aeshape0"


def _qdisc(iface: str) -> str:
    return subprocess.run(["tc", "qdisc", "show", "dev", iface], capture_output=True, text=True).stdout


@pytest.fixture
def dummy():
    if os.geteuid() != 0:
        pytest.fail("needs root (CI runs as root): a qdisc on a link of the test's own")
    subprocess.run(["ip", "link", "del", IFACE], capture_output=True)
    subprocess.run(["ip", "link", "add", IFACE, "type", "veth", "peer", "name", IFACE + "p"], check=True)
    try:
        yield IFACE
    finally:
        subprocess.run(["ip", "link", "del", IFACE], capture_output=True)


def test_a_tbf_qdisc_holds_the_interface_inside_the_block_and_is_removed_after(dummy):
    with shape.throttled(dummy, 50e6 / 8) as shaped:
        assert shaped == f"tbf 50mbit on {dummy}"
        assert "tbf" in _qdisc(dummy) and "50Mbit" in _qdisc(dummy)
    assert "tbf" not in _qdisc(dummy)


def test_the_shared_loopback_and_no_interface_are_never_shaped():
    # A qdisc on `lo` would slow every local node at once: the probe sleeps instead.
    for iface in ("lo", ""):
        with shape.throttled(iface, 1e6) as shaped:
            assert shaped is None
    assert "tbf" not in _qdisc("lo")
