"""The injected `slow_link` fault as a real throttled link: a token-bucket (`tbf`) qdisc on this
node's own egress interface while the pre-flight probe runs, removed after it.

Only where the node has an interface of its own and `tc` may change it (root): the local backend's
per-node network namespaces (`backend_options: {netns: true}`, each node's `eth0` one end of a veth
pair) or a real host. On the shared loopback a qdisc would slow every node at once, so there the
probe's sender sleeps as a slow egress would make it wait (agent/preflight/probe.py). Every command
is a fixed argv; the interface comes from the node's platform identity, never from user input.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
from collections.abc import Iterator

log = logging.getLogger("aerie.agent")

LOOPBACK = "lo"


def can_shape(interface: str) -> bool:
    """Whether a qdisc on `interface` slows this node alone (an interface of its own, as root)."""
    return bool(interface) and interface != LOOPBACK and os.geteuid() == 0 and shutil.which("tc") is not None


@contextlib.contextmanager
def throttled(interface: str, rate_bps: float) -> Iterator[str | None]:
    """`interface`'s egress held to `rate_bps` (bytes/s) inside the block; yields what was shaped
    ("tbf 50mbit on eth0"), or None where it could not be (the caller falls back to the sleep)."""
    if not can_shape(interface):
        yield None
        return
    rate = f"{max(1, int(rate_bps * 8 / 1e6))}mbit"
    argv = ["tc", "qdisc", "replace", "dev", interface, "root", "tbf", "rate", rate]
    r = subprocess.run([*argv, "burst", "64kb", "latency", "500ms"], capture_output=True, text=True)
    if r.returncode != 0:
        log.warning("pre-flight: could not shape %s (%s): the probe sleeps instead", interface, r.stderr.strip())
        yield None
        return
    log.warning("pre-flight: injected slow_link: %s egress held to %s", interface, rate)
    try:
        yield f"tbf {rate} on {interface}"
    finally:
        subprocess.run(["tc", "qdisc", "del", "dev", interface, "root"], capture_output=True)
