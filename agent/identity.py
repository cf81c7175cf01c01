"""Who this node is: its name, its peers, its rank and where the rendezvous is, for every backend.

A node learns its identity from the platform's own contract, never from variables only one of
Aerie's backends happens to set. In this order:

1. `<ML root>/input/config/resourceconfig.json` — SageMaker's own file (`current_host`,
   `current_instance_type`, `current_group_name`, `hosts`, `instance_groups`,
   `network_interface_name`); the local backend and the Slurm bootstrap write the same layout.
   The ML root is `AERIE_ML_ROOT`, else `/opt/ml` (a container).
2. The backend's variables: Slurm's (`SLURMD_NODENAME`, `SLURM_JOB_NODELIST`, `SLURM_JOB_ID`),
   then the SageMaker training toolkit's (`SM_HOSTS`, `SM_CURRENT_HOST`) for a launcher that
   sets them without the file.
3. Defaults: one node, `algo-1`.

Hosts are sorted (SageMaker lists them sorted lexicographically); the node rank is this host's
index and the rendezvous master is the first host — the node that hosts torchrun's store as node
rank 0. Its address is `AERIE_MASTER_ADDR` where a backend knows better than the name (the local
backend's loopback or namespace address, Slurm's `NodeAddr`), `127.0.0.1` for a one-node job, else
the master's host name (SageMaker's `algo-N` names resolve inside the job's network). The port is
`AERIE_MASTER_PORT`, else derived from the Slurm job id, else 29500: every node computes the same
value with nothing passed. Torch-free and standard library only.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from itertools import product
from pathlib import Path
from typing import Any

from aerie_contracts import env as E
from aerie_contracts.container import DEFAULT_GROUP, DEFAULT_ML_ROOT, RESOURCE_CONFIG, NodeLayout, resource_config

DEFAULT_HOST = "algo-1"
DEFAULT_MASTER_PORT = E.DEFAULT_MASTER_PORT
# Slurm: the port is derived from the job id (aerie_contracts.env.SLURM_PORT_BASE, _SPAN).
SLURM_PORT_BASE, SLURM_PORT_SPAN = E.SLURM_PORT_BASE, E.SLURM_PORT_SPAN


class IdentityError(ValueError):
    """The platform's description of the node is unusable (said plainly, never guessed around)."""


@dataclass(frozen=True)
class NodeIdentity(NodeLayout):
    ml_root: Path
    hosts: tuple[str, ...]
    current_host: str
    master_addr: str
    master_port: int
    instance_type: str = "local"
    group: str = DEFAULT_GROUP
    instance_groups: tuple[dict[str, Any], ...] = ()
    network_interface: str = ""
    source: str = "default"  # where it came from: resourceconfig, slurm, sm_env, default
    # Every host of the platform's job, hot spares too (`hosts` leaves them out: without_spares);
    # empty when there are none.
    all_hosts: tuple[str, ...] = ()

    @property
    def node_rank(self) -> int:
        return self.hosts.index(self.current_host)

    @property
    def master_host(self) -> str:
        return self.hosts[0]

    @property
    def group_hosts(self) -> list[str]:
        for g in self.instance_groups:
            if g.get("instance_group_name") == self.group:
                return list(g.get("hosts") or [])
        return list(self.hosts)

    def resource_config(self) -> dict[str, Any]:
        """This identity as SageMaker's resourceconfig.json."""
        return resource_config(
            self.current_host, self.hosts, self.instance_type, self.network_interface, self.group, self.instance_groups
        )


def ml_root(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    return Path(env.get(E.ML_ROOT) or DEFAULT_ML_ROOT)


def node_dir(env: Mapping[str, str] | None = None) -> Path:
    """The agent's own files: `AERIE_NODE_DIR` as the agent exported it to its ranks, else derived
    from the ML root (never the working directory: pid and exit files must land where the agent reads)."""
    env = os.environ if env is None else env
    return Path(env.get(E.NODE_DIR) or ml_root(env) / "agent")


def resolve_identity(env: Mapping[str, str] | None = None) -> NodeIdentity:
    """This node's identity, from the first source that describes it (see the module's docstring)."""
    env = os.environ if env is None else env
    root = ml_root(env)
    rc = _read_resource_config(root / RESOURCE_CONFIG)
    if rc is not None:
        return without_spares(from_resource_config(rc, env, root), spare_hosts(env))
    if env.get("SLURM_JOB_NODELIST") and (env.get("SLURMD_NODENAME") or env.get("SLURM_NODEID")):
        return from_slurm(env, root=root)
    if env.get("SM_HOSTS") or env.get("SM_CURRENT_HOST"):
        return _from_sm_env(env, root)
    return _build(env, root, [DEFAULT_HOST], DEFAULT_HOST, source="default")


def spare_hosts(env: Mapping[str, str] | None = None) -> list[str]:
    """The job's hot spares among its hosts (AERIE_SPARE_HOSTS: a SageMaker training job's extra
    instances, the same list on every one)."""
    env = os.environ if env is None else env
    return [h.strip() for h in (env.get(E.SPARE_HOSTS) or "").split(",") if h.strip()]


def without_spares(ident: NodeIdentity, spares: list[str]) -> NodeIdentity:
    """The attempt's identity once the hot spares are set apart: a spare is a node of no attempt
    yet (its own host alone, until the control plane hands it a slot); the others' hosts (their
    ranks, the rendezvous) leave the spares out."""
    spare = [h for h in ident.hosts if h in spares]
    if not spare:
        return ident
    hosts = (ident.current_host,) if ident.current_host in spare else tuple(h for h in ident.hosts if h not in spare)
    groups = tuple({**g, "hosts": [h for h in g.get("hosts") or [] if h in hosts]} for g in ident.instance_groups)
    # The rendezvous host stays the first of all (a spare never sorts first); a slot handed over
    # later moves it where needed (the supervisor's `_take_hosts`).
    return dataclasses.replace(ident, hosts=hosts, instance_groups=groups, all_hosts=tuple(ident.hosts))


def from_resource_config(rc: dict[str, Any], env: Mapping[str, str], root: Path) -> NodeIdentity:
    where = root / RESOURCE_CONFIG
    hosts, current = rc.get("hosts"), rc.get("current_host")
    if not isinstance(hosts, list) or not hosts or not all(isinstance(h, str) and h for h in hosts):
        raise IdentityError(f"{where}: 'hosts' must be a non-empty list of host names, got {hosts!r}")
    if not isinstance(current, str) or current not in hosts:
        raise IdentityError(f"{where}: current_host {current!r} is not one of hosts {hosts}")
    groups = rc.get("instance_groups") or []
    if not isinstance(groups, list) or not all(isinstance(g, dict) for g in groups):
        raise IdentityError(f"{where}: 'instance_groups' must be a list of objects, got {groups!r}")
    return _build(
        env,
        root,
        hosts,
        current,
        source="resourceconfig",
        instance_type=str(rc.get("current_instance_type") or "local"),
        group=str(rc.get("current_group_name") or rc.get("current_instance_group") or DEFAULT_GROUP),
        instance_groups=tuple(groups),
        network_interface=str(rc.get("network_interface_name") or ""),
    )


def from_slurm(
    env: Mapping[str, str],
    expand: Callable[[str], list[str]] | None = None,
    root: Path | None = None,
    master_addr: str | None = None,
) -> NodeIdentity:
    """The identity Slurm's variables give a task: hosts from `SLURM_JOB_NODELIST` (expanded by
    `expand`, e.g. `scontrol show hostnames`, else by `expand_hostlist`), this host from
    `SLURMD_NODENAME` (else the list's `SLURM_NODEID`-th), the port from `SLURM_JOB_ID`."""
    hosts = (expand or expand_hostlist)(env["SLURM_JOB_NODELIST"])
    if not hosts:
        raise IdentityError(f"SLURM_JOB_NODELIST {env['SLURM_JOB_NODELIST']!r} names no host")
    current = env.get("SLURMD_NODENAME") or hosts[int(env.get("SLURM_NODEID", "0"))]
    if current not in hosts:
        raise IdentityError(f"SLURMD_NODENAME {current!r} is not in SLURM_JOB_NODELIST {hosts}")
    overrides = dict(env)
    if master_addr:
        overrides[E.MASTER_ADDR] = master_addr
    return _build(overrides, root or ml_root(env), hosts, current, source="slurm", instance_type="slurm")


def _from_sm_env(env: Mapping[str, str], root: Path) -> NodeIdentity:
    try:
        hosts = json.loads(env.get("SM_HOSTS") or "[]")
    except ValueError as exc:
        raise IdentityError(f"SM_HOSTS is not a JSON list: {env.get('SM_HOSTS')!r}") from exc
    current = env.get("SM_CURRENT_HOST") or (hosts[0] if hosts else DEFAULT_HOST)
    hosts = hosts or [current]
    if current not in hosts:
        raise IdentityError(f"SM_CURRENT_HOST {current!r} is not one of SM_HOSTS {hosts}")
    return _build(
        env,
        root,
        hosts,
        current,
        source="sm_env",
        instance_type=env.get("SM_CURRENT_INSTANCE_TYPE") or "local",
        network_interface=env.get("SM_NETWORK_INTERFACE_NAME") or "",
    )


def _build(
    env: Mapping[str, str], root: Path, hosts: list[str], current: str, *, source: str, **extra: Any
) -> NodeIdentity:
    ordered = tuple(sorted(dict.fromkeys(hosts)))  # SageMaker's order; the same list on every node
    return NodeIdentity(
        ml_root=root,
        hosts=ordered,
        current_host=current,
        master_addr=master_address(env, ordered),
        master_port=master_port(env),
        source=source,
        **extra,
    )


def master_address(env: Mapping[str, str], hosts: tuple[str, ...]) -> str:
    if env.get(E.MASTER_ADDR):
        return env[E.MASTER_ADDR]
    return "127.0.0.1" if len(hosts) == 1 else hosts[0]


def master_port(env: Mapping[str, str]) -> int:
    raw = env.get(E.MASTER_PORT)
    if raw:
        try:
            return int(raw)
        except ValueError as exc:
            raise IdentityError(f"{E.MASTER_PORT} must be a port number, got {raw!r}") from exc
    if env.get("SLURM_JOB_ID", "").isdigit():
        return SLURM_PORT_BASE + int(env["SLURM_JOB_ID"]) % SLURM_PORT_SPAN
    return DEFAULT_MASTER_PORT


_RANGE = re.compile(r"\[([^\]]+)\]")


def expand_hostlist(nodelist: str) -> list[str]:
    """Slurm's compressed host list (`node[1-3,7],gpu[01-02]`, several brackets too), expanded in order."""
    out: list[str] = []
    for expr in _split_top_level(nodelist):
        parts = _RANGE.split(expr)  # literal, range, literal, range, ..., literal
        choices: list[list[str]] = []
        for i, part in enumerate(parts):
            choices.append(_expand_range(part) if i % 2 else [part])
        out.extend("".join(p) for p in product(*choices))
    return [h for h in out if h]


def _split_top_level(nodelist: str) -> list[str]:
    exprs, depth, cur = [], 0, ""
    for ch in nodelist:
        depth += ch == "["
        depth -= ch == "]"
        if ch == "," and depth == 0:
            exprs.append(cur)
            cur = ""
        else:
            cur += ch
    return [e.strip() for e in [*exprs, cur] if e.strip()]


def _expand_range(spec: str) -> list[str]:
    out = []
    for item in spec.split(","):
        lo, _, hi = item.partition("-")
        if not hi:
            out.append(lo)
            continue
        if not (lo.isdigit() and hi.isdigit()):
            raise IdentityError(f"bad Slurm host range {item!r}")
        out.extend(str(n).zfill(len(lo)) for n in range(int(lo), int(hi) + 1))
    return out


def _read_resource_config(path: Path) -> dict[str, Any] | None:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise IdentityError(f"cannot read {path}: {exc}") from exc
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise IdentityError(f"{path} is not JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise IdentityError(f"{path} must hold a JSON object, got {type(data).__name__}")
    return data
