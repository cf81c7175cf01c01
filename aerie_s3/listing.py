"""The objects under an S3 prefix, with what a download and a cache need (size, ETag)."""

from __future__ import annotations

from dataclasses import dataclass

from aerie_s3.clients import boto3_client
from aerie_s3.settings import S3Settings, parse_uri


@dataclass(frozen=True)
class RemoteObject:
    bucket: str
    key: str
    size: int
    etag: str  # as S3 lists it, without the quotes

    @property
    def uri(self) -> str:
        return f"s3://{self.bucket}/{self.key}"


def list_prefix(uri: str, settings: S3Settings | None = None, limit: int | None = None) -> list[RemoteObject]:
    """Every object whose key starts with the URI's key part, in key order (S3's order).

    "Folder" markers (zero-byte keys ending in "/") are not data and are left out. `limit` stops
    after that many objects (an existence check). Raises botocore's errors as they are
    (`describe_error` words them)."""
    bucket, prefix = parse_uri(uri)
    client = boto3_client(settings)
    out: list[RemoteObject] = []
    kwargs = {"Bucket": bucket, "Prefix": prefix}
    if limit:
        kwargs["PaginationConfig"] = {"MaxItems": limit}
    for page in client.get_paginator("list_objects_v2").paginate(**kwargs):
        for item in page.get("Contents", []):
            if item["Key"].endswith("/") and item["Size"] == 0:
                continue
            out.append(RemoteObject(bucket, item["Key"], int(item["Size"]), item["ETag"].strip('"')))
            if limit and len(out) >= limit:
                return out
    return out


def describe_error(exc: BaseException) -> str:
    """A botocore/CRT error in one line a person can act on (code and message, no stack)."""
    response = getattr(exc, "response", None)
    if isinstance(response, dict) and response.get("Error"):
        err = response["Error"]
        status = (response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
        code = err.get("Code") or status
        return f"{code}: {err.get('Message') or 'no message'}" + (f" (HTTP {status})" if status else "")
    return f"{type(exc).__name__}: {exc}"
