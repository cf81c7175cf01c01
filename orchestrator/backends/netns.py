"""Per-node network namespaces for the local backend (`backend_options: {netns: true}`, root only).

Without them every local node shares the machine's loopback, so no node has NIC counters of its
own and a NIC fault can't be aimed at one node. With them each node gets its own namespace whose
`eth0` is one end of a veth pair; the other ends hang off a bridge in the root namespace (the
"switch"). Collectives cross the veths, each agent reads its own `eth0` counters, and
`ip link set <node's root-side veth> down` (or a tbf qdisc on it) really stalls one node.

Every command is a fixed argv (no shell); names derive from the attempt id, not from user input.
"""

from __future__ import annotations

import hashlib
import subprocess
from dataclasses import dataclass

NS_IFACE = "eth0"


@dataclass(frozen=True)
class NodeNet:
    host: str
    ns: str
    ip: str
    root_if: str  # the root-namespace end of the node's veth: where a NIC fault is injected

    def to_dict(self) -> dict:
        return {"host": self.host, "ns": self.ns, "ip": self.ip, "root_if": self.root_if}


@dataclass(frozen=True)
class Network:
    tag: str
    bridge: str
    bridge_ip: str
    nodes: tuple[NodeNet, ...]

    def to_dict(self) -> dict:
        return {
            "tag": self.tag,
            "bridge": self.bridge,
            "bridge_ip": self.bridge_ip,
            "nodes": {n.host: n.to_dict() for n in self.nodes},
        }

    def node(self, host: str) -> NodeNet:
        return next(n for n in self.nodes if n.host == host)


def _ip(*argv: str) -> None:
    r = subprocess.run(["ip", *argv], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"ip {' '.join(argv)}: {r.stderr.strip() or r.returncode}")


def plan(attempt_id: str, hosts: list[str]) -> Network:
    tag = hashlib.sha256(attempt_id.encode()).hexdigest()[:6]
    subnet = int(tag, 16) % 250 + 1
    nodes = tuple(
        NodeNet(host, f"aerie-{tag}-{i}", f"10.213.{subnet}.{i + 1}", f"ae{tag}h{i}") for i, host in enumerate(hosts)
    )
    return Network(tag, f"ae{tag}br", f"10.213.{subnet}.254", nodes)


def create(attempt_id: str, hosts: list[str]) -> Network:
    """Namespaces, veths and the bridge for one attempt (torn down by `destroy`)."""
    net = plan(attempt_id, hosts)
    destroy(net)  # a half-built leftover of a crashed launch
    _ip("link", "add", net.bridge, "type", "bridge")
    _ip("addr", "add", f"{net.bridge_ip}/24", "dev", net.bridge)
    _ip("link", "set", net.bridge, "up")
    for i, n in enumerate(net.nodes):
        peer = f"ae{net.tag}n{i}"
        _ip("netns", "add", n.ns)
        _ip("link", "add", n.root_if, "type", "veth", "peer", "name", peer)
        _ip("link", "set", peer, "netns", n.ns)
        _ip("-n", n.ns, "link", "set", peer, "name", NS_IFACE)
        _ip("-n", n.ns, "addr", "add", f"{n.ip}/24", "dev", NS_IFACE)
        _ip("-n", n.ns, "link", "set", NS_IFACE, "up")
        _ip("-n", n.ns, "link", "set", "lo", "up")
        _ip("link", "set", n.root_if, "master", net.bridge)
        _ip("link", "set", n.root_if, "up")
    return net


def destroy(net: Network | dict) -> None:
    """Remove what `create` made; missing pieces are fine (idempotent)."""
    if isinstance(net, dict):
        nodes = [NodeNet(**n) for n in net["nodes"].values()]
        bridge = net["bridge"]
    else:
        nodes, bridge = list(net.nodes), net.bridge
    for n in nodes:
        subprocess.run(["ip", "link", "del", n.root_if], capture_output=True)
        subprocess.run(["ip", "netns", "del", n.ns], capture_output=True)
    subprocess.run(["ip", "link", "del", bridge], capture_output=True)


def available() -> tuple[bool, str]:
    """Whether namespaces can be made here, and if not, why (tests fail with this, not skip)."""
    probe = "aerie-probe"
    r = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if r.returncode != 0:
        return False, f"`ip netns add` failed: {r.stderr.strip()} (needs root and iproute2)"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return True, "ok"
