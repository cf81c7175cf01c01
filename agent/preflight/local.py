"""Several nodes' pre-flight on this one machine at once, each in a thread, the collective over
loopback: how the bench (bench/preflight.py) and the tests rehearse a multi-node pre-flight."""

from __future__ import annotations

import socket
import threading
from collections.abc import Mapping

from aerie_contracts.health import PreflightSettings
from aerie_contracts.preflight import PreflightResult
from agent.preflight import Node, run_checks


def free_port() -> int:
    """A loopback port nothing listens on now (the collective's rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_nodes(
    settings: PreflightSettings,
    hosts: tuple[str, ...],
    attempt: str,
    env: Mapping[str, str],
    timeout_s: float | None = None,
) -> dict[str, PreflightResult]:
    """Every host's `run_checks` at the same time, by host (a host still running after `timeout_s`
    is missing)."""
    port, out = free_port(), {}

    def one(host: str) -> None:
        out[host] = run_checks(settings, Node(host, hosts, "127.0.0.1", port, attempt), env)

    threads = [threading.Thread(target=one, args=(h,)) for h in hosts]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s)
    return out
