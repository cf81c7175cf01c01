"""The checkpoint store is reachable: PUT, HEAD and DELETE of a small probe object under the job's
checkpoint prefix (`AERIE_CHECKPOINT_URI`), with the node's own S3 settings and short timeouts."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping

from aerie_contracts import env as E
from aerie_contracts.preflight import Check, CheckResult, Fault
from aerie_s3.settings import S3Settings, is_s3, parse_uri
from agent.preflight.checks import result, skipped

PROBE_DIR = ".preflight"  # <checkpoint prefix>/.preflight/<host>-<attempt>: deleted at once
UNREACHABLE = "http://127.0.0.1:9"  # the discard port: nothing answers (Fault.STORE_UNREACHABLE)


def probe_key(prefix: str, host: str, attempt: str) -> str:
    return f"{prefix.rstrip('/')}/{PROBE_DIR}/{host}-{attempt or 'na'}" if prefix else f"{PROBE_DIR}/{host}"


def store(env: Mapping[str, str], host: str, attempt: str, timeout_s: float, faults: list[Fault]) -> CheckResult:
    uri = env.get(E.CHECKPOINT_URI) or ""
    if not uri or not is_s3(uri):
        return skipped(Check.STORE, "no S3 checkpoint store for this job" if not uri else f"{uri} is not in S3")
    import boto3
    from botocore.config import Config

    settings = S3Settings.from_env(dict(env))
    endpoint = UNREACHABLE if Fault.STORE_UNREACHABLE in faults else settings.endpoint_url
    bucket, prefix = parse_uri(uri)
    key = probe_key(prefix, host, attempt)
    client = boto3.session.Session().client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=settings.access_key_id,
        aws_secret_access_key=settings.secret_access_key,
        aws_session_token=settings.session_token,
        config=Config(
            region_name=settings.region,
            connect_timeout=timeout_s,
            read_timeout=timeout_s,
            retries={"max_attempts": 2, "mode": "standard"},
            s3={"addressing_style": "path" if settings.path_style else "auto"},
        ),
    )
    body = os.urandom(1024)
    t0 = time.perf_counter()
    step = "PUT"
    try:
        client.put_object(Bucket=bucket, Key=key, Body=body)
        step = "HEAD"
        size = client.head_object(Bucket=bucket, Key=key)["ContentLength"]
        if size != len(body):
            raise RuntimeError(f"HEAD says {size} bytes, {len(body)} were written")
        step = "DELETE"
        client.delete_object(Bucket=bucket, Key=key)
    except Exception as exc:
        took = time.perf_counter() - t0
        injected = " (injected: store_unreachable)" if Fault.STORE_UNREACHABLE in faults else ""
        return result(
            Check.STORE,
            False,
            f"{step} s3://{bucket}/{key} failed after {took:.1f}s: {str(exc)[:200]}{injected}",
            value=None,
            unit="s",
            seconds=took,
            endpoint=endpoint or "aws",
        )
    finally:
        client.close()
    took = time.perf_counter() - t0
    return result(
        Check.STORE,
        True,
        f"PUT+HEAD+DELETE of s3://{bucket}/{key} in {took * 1000:.0f} ms",
        value=took,
        threshold=timeout_s,
        unit="s",
        seconds=took,
    )
