"""Deployment settings, read from CDK context (`cdk.json` or `-c aerie:KEY=VALUE`).

Values given with `-c` on the command line arrive as strings and those in `cdk.json` as JSON,
so every reader here accepts both. Nothing is required: the defaults deploy a small, working
control plane; the README's "Deploy to AWS" section lists the keys people change.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields

from constructs import Node

PREFIX = "aerie:"


def _as_bool(value: object) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no", ""):
        return False
    raise ValueError(f"not a boolean: {value!r}")


def _as_int(value: object) -> int:
    if isinstance(value, bool):
        raise ValueError(f"not an integer: {value!r}")
    return int(str(value).strip())


@dataclass(frozen=True)
class Settings:
    """Every knob of the stack; the field name is the context key after `aerie:`."""

    stack_name: str = "Aerie"
    # Prefix for named resources (event bus, log groups, secrets) so two deployments can share an account.
    name: str = "aerie"
    # ECR repositories (created out of band, see the README, "Deploy to AWS") and the tag to run.
    control_plane_repository: str = "aerie/controlplane"
    trainer_repository: str = "aerie/trainer"
    image_tag: str = "0.1.0"
    # Where checkpoints live inside the bucket: the SageMaker role may write only here.
    checkpoint_prefix: str = "checkpoints/"
    # 0 keeps checkpoints until checkpoint_gc removes them; N expires every object after N days.
    checkpoint_expire_days: int = 0
    # ACM certificate for HTTPS on the load balancer; empty serves plain HTTP on port 80.
    certificate_arn: str = ""
    # Public URL agents, handlers and people use for the API when a DNS name points at the ALB.
    public_url: str = ""
    ingress_cidr: str = "0.0.0.0/0"
    nat_gateways: int = 1
    desired_count: int = 1
    task_cpu: int = 512
    task_memory_mib: int = 1024
    db_instance_type: str = "t4g.small"
    db_multi_az: bool = False
    db_allocated_storage_gb: int = 20
    health_check_path: str = "/healthz"
    # Keep the bucket and a final database snapshot when the stack is deleted.
    retain_data: bool = True

    @classmethod
    def from_context(cls, node: Node) -> Settings:
        known = {PREFIX + _camel(f.name) for f in fields(cls)}
        unknown = sorted(k for k in node.get_all_context() if k.startswith(PREFIX) and k not in known)
        if unknown:  # a typo would otherwise deploy the default silently
            raise ValueError(f"unknown context keys {unknown}; known: {sorted(known)}")
        values: dict[str, object] = {}
        for field in fields(cls):
            raw = node.try_get_context(PREFIX + _camel(field.name))
            if raw is None:
                continue
            if field.type == "bool":
                values[field.name] = _as_bool(raw)
            elif field.type == "int":
                values[field.name] = _as_int(raw)
            else:
                values[field.name] = str(raw)
        settings = cls(**values)
        settings.validate()
        return settings

    def validate(self) -> None:
        """Refuse values that would synthesize a template AWS rejects later, at deploy time."""
        if not re.fullmatch(r"[a-z][a-z0-9-]{0,30}", self.name):
            raise ValueError(f"aerie:name must be lowercase letters, digits, '-': {self.name!r}")
        if not self.checkpoint_prefix.endswith("/") or self.checkpoint_prefix.startswith("/"):
            raise ValueError(f"aerie:checkpointPrefix must look like 'checkpoints/': {self.checkpoint_prefix!r}")
        if "*" in self.checkpoint_prefix:
            raise ValueError("aerie:checkpointPrefix may not contain '*'")
        if self.image_tag in ("", "latest"):
            raise ValueError("aerie:imageTag must name a pinned tag, not 'latest'")
        if self.checkpoint_expire_days < 0:
            raise ValueError("aerie:checkpointExpireDays must be >= 0")


def _camel(snake: str) -> str:
    head, *rest = snake.split("_")
    return head + "".join(part.title() for part in rest)
