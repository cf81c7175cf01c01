"""`python -m agent.slurm LAUNCH_JSON`: one Slurm task's bootstrap, run by `srun` on every node.

The control plane cannot know which nodes Slurm will allocate, so each node builds its own
container contract here, from Slurm's variables (`agent.identity.from_slurm`): the hosts from
`scontrol show hostnames $SLURM_JOB_NODELIST` (sorted, as SageMaker's), the current host from
`SLURMD_NODENAME`, the rendezvous on the first host's `NodeAddr`, the port derived from the job id.
It writes SageMaker's `resourceconfig.json`, which the agent then reads as on any backend, and
becomes (exec) `python -m agent.entrypoint` with the same environment the local backend gives a
node, output appended to the node's `logs/node.log`.

With hot spares (`resources.spare_nodes`) the allocation holds more nodes than the attempt: the
first `nodes` of the sorted hosts are the attempt's, the rest spares (`AERIE_SPARE=1`, a contract
naming themselves alone); `hosts.json` records both for the control plane. A spare allocation
(the backend's replenished spares, `nodes: 0`) is all spares: its nodes record themselves in the
file `hosts_file` names (not the main allocation's `hosts.json`), under the same attempt root, and
take their memory ring ports after the main allocation's (`memory_job_id`, `memory_index`).

LAUNCH_JSON (written by `orchestrator.backends.slurm` beside the batch script) carries every user
value, so nothing a user wrote is ever pasted into shell text. Torch-free, and it imports nothing
from `orchestrator` (the agent speaks HTTP and reads files).
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from aerie_contracts import FailureKind, memckpt
from aerie_contracts import env as aerie_env
from aerie_contracts.container import NodeContract, write_json
from agent.identity import from_slurm


def main(argv: list[str]) -> int:
    launch_path = Path(argv[0] if argv else os.environ[aerie_env.SLURM_LAUNCH])
    launch = json.loads(launch_path.read_text())
    root = Path(launch["root"])
    host = current_host()
    try:
        slurm_vars = {k: v for k, v in os.environ.items() if k.startswith(("SLURM", "SLURMD"))}
        everyone = from_slurm(slurm_vars, expand=job_hosts, root=root / host).hosts  # sorted
        hosts, spares = split_hosts(everyone, launch.get("nodes"))
        # A hot spare is a node of no attempt yet: its own host alone, until it is handed a slot.
        spare = host in spares
        ident = from_slurm(slurm_vars, expand=lambda _: [host] if spare else hosts, root=root / host)
        # A spare allocation runs no attempt: a spare is its own rendezvous until handed a slot.
        master_addr = node_address(hosts[0] if hosts else host)
        master_port = int(launch.get("master_port") or ident.master_port)
        job_id = int(os.environ["SLURM_JOB_ID"])
        record: dict[str, Any] = {"hosts": hosts, "slurm_job_id": job_id}
        if spares:
            record["spares"] = spares
        memory = memory_env(launch, host, job_id, list(everyone))
        if memory:
            record["memory_peers"] = dict(p.split("=", 1) for p in memory[aerie_env.MEMORY_CHECKPOINT_PEERS].split(","))
        write_json(Path(launch.get("hosts_file") or root / "hosts.json"), record)
        contract = NodeContract(
            ml_root=root / ident.current_host,
            hosts=ident.hosts,
            current_host=ident.current_host,
            hyperparameters=dict(launch.get("hyperparameters") or {}),
            channels=dict(launch.get("channels") or {}),
            network_interface=launch.get("network_interface") or interface_towards(master_addr),
            instance_type="slurm",
        )
        contract.write()
        env = compose_env(os.environ, launch.get("env") or {}, contract.env(), master_addr, master_port)
        if spare:
            env[aerie_env.SPARE] = "1"
        env.update(memory)
    except Exception as exc:  # the node never started: say why where the backend looks
        _record_failure(root / host, host, f"slurm bootstrap failed on {host}: {exc!r}")
        print(f"aerie slurm bootstrap failed on {host}: {exc!r}", file=sys.stderr, flush=True)
        return 1
    log = os.open(contract.ml_root / "logs" / "node.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.chdir(launch.get("workdir") or os.getcwd())
    # exec: the Slurm task *is* the node's entrypoint, so scancel's signals reach it directly.
    os.execve(sys.executable, [sys.executable, "-m", "agent.entrypoint"], env)
    return 1  # pragma: no cover - execve does not return


def compose_env(
    inherited: dict[str, str] | Any,
    layers: dict[str, dict[str, str]],
    contract_env: dict[str, str],
    master_addr: str,
    master_port: int,
) -> dict[str, str]:
    """The node's environment, layered exactly as `orchestrator.backends.nodeenv.node_env` does."""
    env = {k: v for k, v in dict(inherited).items() if not k.startswith(("AERIE_", "SM_"))}
    env.update(layers.get("user") or {})
    env.update(contract_env)
    env.update(layers.get("extra") or {})
    env.update(layers.get("attempt") or {})
    env.update({aerie_env.MASTER_ADDR: master_addr, aerie_env.MASTER_PORT: str(master_port)})
    return env


def split_hosts(everyone: tuple[str, ...] | list[str], nodes: Any) -> tuple[list[str], list[str]]:
    """The job's sorted hosts as (the attempt's, the hot spares'): the first `nodes` (launch.json's
    `instance_count`) and the rest (`resources.spare_nodes`); every node computes the same split."""
    count = len(everyone) if nodes is None else int(nodes)  # 0: a spare allocation, all spares
    return list(everyone[:count]), list(everyone[count:])


def memory_env(launch: dict[str, Any], host: str, job_id: int, everyone: list[str]) -> dict[str, str]:
    """This node's part of the in-memory checkpoint tier's settings (the control plane put the
    interval and the key in launch.json's attempt layer, and `memory_root` where it is on): its own
    folder under the root, and the ring's endpoints of every node of the allocation, spares too."""
    root = launch.get("memory_root")
    if not root:
        return {}
    addresses = node_addresses(everyone)
    # A spare allocation's nodes take the ports after the main allocation's (derived from its job
    # id, not their own): every node of the emulated cluster shares one address, and a port
    # derived from the spare allocation's id (the next one, often) would be one of the main's.
    base_id = int(launch.get("memory_job_id") or job_id)
    first = int(launch.get("memory_index") or 0)
    peers = ",".join(f"{h}={addresses.get(h, h)}:{memory_port(base_id, first + i)}" for i, h in enumerate(everyone))
    return {
        aerie_env.MEMORY_CHECKPOINT_DIR: str(Path(root) / memckpt.safe_name(host, "host")),
        aerie_env.MEMORY_CHECKPOINT_PEERS: peers,
    }


def memory_port(job_id: int, index: int) -> int:
    """The replication endpoint's port of the job's `index`-th node (sorted): derived from the job
    id as the rendezvous port is, half the range away from it, one port per node (all of the
    emulated cluster's nodes share one address), so every node computes every node's."""
    low, span = aerie_env.SLURM_PORT_BASE, aerie_env.SLURM_PORT_SPAN
    return low + (job_id % span + span // 2 + index) % span


def node_addresses(hosts: list[str]) -> dict[str, str]:
    """{node: NodeAddr} for `hosts`, from one `scontrol show node -o` (a host it does not list is
    reached by its name)."""
    try:
        out = subprocess.run(["scontrol", "show", "node", "-o"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    found: dict[str, str] = {}
    for line in out.splitlines():
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        if fields.get("NodeName") in hosts and fields.get("NodeAddr"):
            found[fields["NodeName"]] = fields["NodeAddr"]
    return found


def current_host() -> str:
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


def job_hosts(nodelist: str) -> list[str]:
    """`node[1-2]` -> ["node1", "node2"], in Slurm's order (the same on every node)."""
    out = subprocess.run(
        ["scontrol", "show", "hostnames", nodelist], check=True, capture_output=True, text=True, timeout=30
    ).stdout
    hosts = [h.strip() for h in out.splitlines() if h.strip()]
    if not hosts:
        raise RuntimeError(f"scontrol show hostnames {nodelist!r} listed no hosts")
    return hosts


def node_address(node: str) -> str:
    """The address Slurm itself uses for `node` (NodeAddr: 127.0.0.1 on the emulated cluster)."""
    out = subprocess.run(["scontrol", "show", "node", "-o", node], capture_output=True, text=True, timeout=30).stdout
    for field in out.split():
        if field.startswith("NodeAddr="):
            return field.split("=", 1)[1]
    return node  # a resolvable host name is also a fine rendezvous address


def interface_towards(addr: str) -> str:
    """The NIC the rendezvous traffic uses: `lo` for a loopback master, else the default route's."""
    try:
        if ipaddress.ip_address(addr).is_loopback:
            return "lo"
    except ValueError:
        pass
    try:
        for line in Path("/proc/net/route").read_text().splitlines()[1:]:
            fields = line.split()
            if len(fields) > 1 and fields[1] == "00000000":
                return fields[0]
    except OSError:
        pass
    return "lo"


def _record_failure(ml_root: Path, host: str, message: str) -> None:
    node_dir = ml_root / "agent"
    node_dir.mkdir(parents=True, exist_ok=True)
    write_json(
        node_dir / "exit.json",
        {
            "exit_code": 1,
            "t": time.time(),
            "host": host,
            "reason": {"kind": FailureKind.LAUNCH_FAILED, "host": host, "message": message},
        },
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
