"""The agent's configuration, read once from the node's contract environment, and the argv that
starts the node's ranks (torchrun over the `agent.rank` wrapper)."""

from __future__ import annotations

import json
import logging
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aerie_contracts import env as E
from aerie_contracts.env import SECTIONS
from aerie_contracts.failures import FailureKind
from aerie_contracts.health import HealthSettings, merge_learned
from agent.identity import IdentityError, NodeIdentity, ml_root, resolve_identity

log = logging.getLogger("aerie.agent")


@dataclass(frozen=True)
class AgentConfig:
    """Everything the agent needs, read once from the contract environment."""

    ml_root: Path
    node_dir: Path
    metrics_dir: Path
    hosts: tuple[str, ...]
    host: str
    entrypoint: tuple[str, ...]
    procs_per_node: int = 1
    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    workdir: Path = Path(".")
    api: str = ""
    token: str = ""
    attempt: str = ""
    health: HealthSettings = field(default_factory=HealthSettings)  # AERIE_HEALTH, parsed once here
    learned: dict[str, list[float]] = field(default_factory=dict)  # AERIE_SECTIONS
    interfaces: tuple[str, ...] = ()
    identity: NodeIdentity | None = None  # where hosts/host/master came from (None: given directly)

    def __post_init__(self) -> None:
        # The health settings are typed from here on: a mapping given directly (a test, a
        # launcher) is parsed once, here, like AERIE_HEALTH in `from_env`; nothing below re-reads it.
        if not isinstance(self.health, HealthSettings):
            object.__setattr__(self, "health", HealthSettings.from_dict(dict(self.health or {})))

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> AgentConfig:
        """Identity from the platform's contract (`agent.identity`: resourceconfig.json first),
        the job from Aerie's AERIE_* variables."""
        env = dict(os.environ if env is None else env)
        try:
            ident = resolve_identity(env)
        except IdentityError as exc:
            # The node cannot start: say why where SageMaker (FailureReason) and the backends look.
            write_failure(ml_root(env), {"kind": FailureKind.LAUNCH_FAILED, "message": str(exc)})
            raise SystemExit(f"agent: {exc}") from exc
        entry = json.loads(env[E.ENTRYPOINT]) if env.get(E.ENTRYPOINT) else []
        if not entry:
            raise SystemExit("agent: AERIE_ENTRYPOINT is empty: nothing to run")
        return cls(
            ml_root=ident.ml_root,
            node_dir=ident.node_dir,
            metrics_dir=Path(env.get(E.METRICS_PATH) or ident.metrics_dir),
            hosts=ident.hosts,
            host=ident.current_host,
            entrypoint=tuple(entry),
            procs_per_node=int(env.get(E.PROCS_PER_NODE, "1")),
            master_addr=ident.master_addr,
            master_port=ident.master_port,
            workdir=Path(env.get(E.WORKDIR, os.getcwd())),
            api=env.get(E.API, ""),
            token=env.get(E.AGENT_TOKEN, ""),
            attempt=env.get(E.ATTEMPT, ""),
            health=HealthSettings.from_dict(json.loads(env.get(E.HEALTH) or "{}")),
            learned=learned_sections(env.get(SECTIONS)),
            interfaces=tuple(i.strip() for i in ident.network_interface.split(",") if i.strip()),
            identity=ident,
        )

    @property
    def node_rank(self) -> int:
        return self.hosts.index(self.host)

    @property
    def node_identity(self) -> NodeIdentity:
        if self.identity is not None:
            return self.identity
        return NodeIdentity(
            self.ml_root,
            self.hosts,
            self.host,
            self.master_addr,
            self.master_port,
            network_interface=",".join(self.interfaces),
        )

    @property
    def world_size(self) -> int:
        return len(self.hosts) * self.procs_per_node


def rank_command(cfg: AgentConfig) -> list[str]:
    """The argv that starts this node's ranks, each under the `agent.rank` wrapper."""
    wrapped = [sys.executable, "-m", "agent.rank", "--", *cfg.entrypoint]
    if cfg.world_size == 1:
        return wrapped
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nnodes={len(cfg.hosts)}",
        f"--nproc-per-node={cfg.procs_per_node}",
        f"--node-rank={cfg.node_rank}",
        f"--master-addr={cfg.master_addr}",
        f"--master-port={cfg.master_port}",
        "--max-restarts=0",
        "--monitor-interval=1",
        "--no-python",
        *wrapped,
    ]


def write_failure(ml_root: Path, reason: dict[str, Any]) -> None:
    """`output/failure`: "<kind>: <message>", the line SageMaker quotes in FailureReason."""
    failure = ml_root / "output" / "failure"
    try:
        failure.parent.mkdir(parents=True, exist_ok=True)
        failure.write_text(f"{reason.get('kind')}: {reason.get('message', '')}\n")
    except OSError:
        log.exception("cannot write %s", failure)


def learned_sections(text: str | None) -> dict[str, list[float]]:
    """`AERIE_SECTIONS`, validated: a malformed value costs the learned limits, never the node."""
    try:
        return merge_learned([json.loads(text)]) if text else {}
    except (ValueError, TypeError, AttributeError):
        log.warning("ignoring malformed %s: %.200s", SECTIONS, text)
        return {}
