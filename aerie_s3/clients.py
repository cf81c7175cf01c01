"""The two S3 clients: boto3 for control calls, the AWS CRT for bytes.

The CRT client is s3torchconnectorclient's `MountpointS3Client` (the Rust mountpoint-s3-client on
aws-c-s3), used directly: it needs no torch, so the agent can download with it. A CRT client does
not survive fork (its event-loop threads stay in the parent), so clients are kept per process.
"""

from __future__ import annotations

import functools
import os
import threading

from aerie_s3.settings import MiB, S3Settings


@functools.lru_cache(maxsize=8)
def _boto3_client(settings: S3Settings, max_pool_connections: int):
    return new_boto3_client(settings, max_pool_connections)


def new_boto3_client(settings: S3Settings, max_pool_connections: int = 10):
    """A boto3 S3 client of the caller's own (close() it to drop its connections)."""
    import boto3
    from botocore.config import Config

    config = Config(
        region_name=settings.region,
        retries={"max_attempts": settings.max_attempts, "mode": "standard"},
        max_pool_connections=max_pool_connections,
        s3={"addressing_style": "path" if settings.path_style else "auto"},
    )
    return boto3.session.Session().client(
        "s3",
        endpoint_url=settings.endpoint_url,
        aws_access_key_id=settings.access_key_id,
        aws_secret_access_key=settings.secret_access_key,
        aws_session_token=settings.session_token,
        config=config,
    )


def boto3_client(settings: S3Settings | None = None, max_pool_connections: int = 32):
    """A boto3 S3 client for control calls (clients are thread-safe; cached per settings)."""
    return _boto3_client(settings or S3Settings.from_env(), max_pool_connections)


_crt_lock = threading.Lock()
_crt_clients: dict[tuple[S3Settings, int, float], tuple[int, object]] = {}
# The CRT sizes its connection pool from its throughput target: measured through the throttling
# proxy, a 10 Gb/s target ran only 10 of 16 GETs at once (the rest queued inside the CRT).
GBPS_PER_CONNECTION = 1.5


def crt_client(settings: S3Settings | None = None, part_size: int | None = None, connections: int = 0):
    """The CRT client bound to the configured endpoint (one per settings, part size, connections
    and process).

    `part_size` is the CRT's own split of a large request; the engine in `aerie_s3.ranged` asks
    for slices no larger than it, so each slice is exactly one GET. The CRT refuses parts under
    5 MiB, even for GETs. `connections`: GETs the caller keeps in flight; the CRT's throughput
    target is raised so that it runs them all at once.
    """
    from s3torchconnectorclient._mountpoint_s3_client import MountpointS3Client

    settings = settings or S3Settings.from_env()
    part = max(part_size or settings.read_part_size, 5 * MiB)
    target = max(settings.throughput_target_gbps, connections * GBPS_PER_CONNECTION)
    key = (settings, part, target)
    with _crt_lock:
        pid, client = _crt_clients.get(key, (None, None))
        if client is None or pid != os.getpid():
            kwargs = {}
            if settings.endpoint_url:
                kwargs["endpoint"] = settings.endpoint_url
            client = MountpointS3Client(
                settings.region,
                user_agent_prefix="aerie",
                throughput_target_gbps=target,
                part_size=part,
                force_path_style=settings.path_style,
                max_attempts=settings.max_attempts,
                **kwargs,
            )
            _crt_clients[key] = (os.getpid(), client)
        return client
