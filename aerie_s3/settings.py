"""Where S3 is and how to talk to it, from the environment (one place for every S3 user).

`AERIE_S3_ENDPOINT` (else `AWS_ENDPOINT_URL`), `AWS_REGION` (else `AWS_DEFAULT_REGION`, else
us-east-1), the usual AWS credential variables (or boto3's/CRT's default chain),
`AERIE_S3_PART_SIZE` (bytes, default 8 MiB: multipart uploads), `AERIE_S3_READ_PART_SIZE`
(largest ranged GET, default 16 MiB), `AERIE_S3_CONNECTIONS` (ranged GETs in flight, default 16),
`AERIE_S3_THROUGHPUT_GBPS` (the CRT's target, default 10) and `AERIE_S3_MAX_ATTEMPTS`.
A non-AWS endpoint (the loopback moto server) gets path-style addressing.
"""

from __future__ import annotations

import os
import urllib.parse
from dataclasses import dataclass

from aerie_contracts import env as aerie_env

MiB = 1024 * 1024


@dataclass(frozen=True)
class S3Settings:
    endpoint_url: str | None = None
    region: str = "us-east-1"
    access_key_id: str | None = None
    secret_access_key: str | None = None
    session_token: str | None = None
    part_size: int = 8 * MiB
    read_part_size: int = 16 * MiB  # one ranged GET; reads have no 5 MiB floor
    connections: int = 16  # ranged GETs in flight (S3 caps each connection, ~80-100 MB/s)
    throughput_target_gbps: float = 10.0
    max_attempts: int = 10

    @classmethod
    def from_env(cls, env: os._Environ[str] | dict[str, str] | None = None) -> S3Settings:
        env = os.environ if env is None else env
        return cls(
            endpoint_url=env.get(aerie_env.S3_ENDPOINT) or env.get("AWS_ENDPOINT_URL") or None,
            region=env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or "us-east-1",
            access_key_id=env.get("AWS_ACCESS_KEY_ID") or None,
            secret_access_key=env.get("AWS_SECRET_ACCESS_KEY") or None,
            session_token=env.get("AWS_SESSION_TOKEN") or None,
            part_size=int(env.get(aerie_env.S3_PART_SIZE) or 8 * MiB),
            read_part_size=int(env.get(aerie_env.S3_READ_PART_SIZE) or 16 * MiB),
            connections=max(1, int(env.get(aerie_env.S3_CONNECTIONS) or 16)),
            throughput_target_gbps=float(env.get(aerie_env.S3_THROUGHPUT_GBPS) or 10.0),
            max_attempts=int(env.get(aerie_env.S3_MAX_ATTEMPTS) or 10),
        )

    @property
    def path_style(self) -> bool:
        """Virtual-hosted buckets only resolve on AWS itself."""
        if not self.endpoint_url:
            return False
        host = urllib.parse.urlparse(self.endpoint_url).hostname or ""
        return not host.endswith("amazonaws.com")


def parse_uri(uri: str) -> tuple[str, str]:
    """`s3://bucket/key/prefix` -> ("bucket", "key/prefix")."""
    parsed = urllib.parse.urlparse(uri)
    if parsed.scheme != "s3" or not parsed.netloc:
        raise ValueError(f"not an s3:// URI: {uri!r}")
    return parsed.netloc, parsed.path.lstrip("/")


def is_s3(uri: str | os.PathLike) -> bool:
    return str(uri).startswith("s3://")
