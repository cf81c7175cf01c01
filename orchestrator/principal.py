"""Who is asking: the identity a token stands for, shared by the REST API (`api/deps.py`) and the
SageMaker-compatible endpoint (`sagemaker_api/`, which authenticates SigV4 to the same identity),
so neither API surface imports the other's authentication."""

from __future__ import annotations

from dataclasses import dataclass

# Token kinds: people have a role (admin > member > viewer); handlers use service tokens;
# each attempt's agents get an agent token that is valid for that attempt only.
WRITERS = {"admin", "member", "service"}


@dataclass(frozen=True)
class Principal:
    kind: str  # admin | member | viewer | service | agent
    tenant: str
    attempt_id: str | None = None
    token_id: int = 0
