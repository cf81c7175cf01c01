"""Starting one local node's process tree: `python -m agent.entrypoint` in a session of its own.

The tree gets its contract directory, Aerie's environment (`nodeenv`), and optionally /opt/ml (a
private mount namespace) or a network namespace of its own. It is started detached so that it
outlives the control plane; from then on only its files say how it is (`local_procs`).
"""

from __future__ import annotations

import os
import shutil
import socket
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psutil

from aerie_contracts import env as aerie_env
from aerie_contracts.container import CHANNEL_CACHE_ENV, NodeContract
from orchestrator.backends import netns
from orchestrator.backends.base import LaunchRequest
from orchestrator.backends.nodeenv import channels, in_place_env, memory_env, node_env


def spawn_node(
    request: LaunchRequest,
    root: Path,
    host: str,
    hosts: list[str],
    *,
    spare: bool,
    peers: dict[str, str],
    key: str | None = None,
    master_port: int,
    net: Any = None,
    channel_cache: Path,
    in_place_wait_s: float,
) -> None:
    """One node's process tree (`python -m agent.entrypoint` in a session of its own)."""
    spec = request.spec
    workdir = Path(spec.backend_options.get("workdir") or os.getcwd())
    container_paths = bool(spec.backend_options.get("container_paths"))
    contract = NodeContract(
        ml_root=root / host,
        # A spare is a node of no attempt yet: its own host alone, until it is handed a slot.
        hosts=(host,) if spare else tuple(hosts),
        current_host=host,
        hyperparameters=dict(spec.hyperparameters),
        channels=channels(spec),
        network_interface=netns.NS_IFACE if net else "lo",
        instance_type=spec.resources.instance_type,
    )
    contract.write()
    env = node_env(request, contract, net.nodes[0].ip if net else "127.0.0.1", master_port, workdir)
    if spec.backend_options.get("model_artifacts_uri"):
        env[aerie_env.MODEL_ARTIFACTS_URI] = str(spec.backend_options["model_artifacts_uri"])
    env.setdefault(CHANNEL_CACHE_ENV, str(channel_cache))
    # The agents outlive their worker groups: a failed attempt may be restarted in place.
    env.update(in_place_env(spec, in_place_wait_s))
    if spare:
        env[aerie_env.SPARE] = "1"
    if peers and key:
        env.update(memory_env(spec, host, peers, key))
    argv = [sys.executable, "-m", "agent.entrypoint"]
    if container_paths:
        # /opt/ml is this node's directory, in a mount namespace of its own; `python` in the
        # user's shell commands is the Python the nodes run (the local stand-in for the image).
        argv = container_paths_argv(contract.ml_root, argv)
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", os.defpath)])
    if net:
        # Inside its namespace the node reaches the control plane through the bridge
        # (`aerie up --host 0.0.0.0`), and gloo uses the node's own eth0.
        env[aerie_env.API] = via(request.api_url, net.bridge_ip)
        env["GLOO_SOCKET_IFNAME"] = netns.NS_IFACE
        argv = ["ip", "netns", "exec", net.node(host).ns, *argv]
    log = open(contract.ml_root / "logs" / "node.log", "ab", buffering=0)
    # start_new_session: the node survives the control plane and can be signalled as a group.
    # The command is a fixed argv; user strings only travel in the environment.
    psutil.Popen(
        argv,
        cwd=str(workdir),
        env=env,
        stdin=open(os.devnull),
        stdout=log,
        stderr=log,
        start_new_session=True,
        close_fds=True,
    )
    log.close()


def check_container_paths() -> None:
    """Nodes with /opt/ml need `unshare` and root (or an /opt/ml to bind over in a user namespace)."""
    if shutil.which("unshare") is None:
        raise RuntimeError("container paths (/opt/ml) need util-linux's `unshare`, which is not installed")
    if os.geteuid() != 0 and not os.path.isdir("/opt/ml"):
        raise RuntimeError("container paths (/opt/ml) need root, or an existing /opt/ml directory to bind over")


def container_paths_argv(ml_root: Path, command: list[str]) -> list[str]:
    """`command` in a private mount namespace with the node's directory bound over /opt/ml."""
    unshare = ["unshare", "--mount", "--propagation", "private"]
    if os.geteuid() != 0:
        unshare.append("--map-root-user")
    return [*unshare, "--", sys.executable, "-m", "agent.container_paths", str(ml_root), "--", *command]


def via(url: str, host: str) -> str:
    """`url` with its host replaced (the control plane as seen from inside a namespace)."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=f"{host}:{parts.port}" if parts.port else host))


def free_port() -> int:
    """A port free on this host now (every local node shares this host's ports)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
