"""AWS Signature Version 4 for the SageMaker-compatible endpoint: credentials and verification.

Credentials. An Aerie API token made with `--aws` also gets an access key id (`AKIA` + 16 random
base-32 characters, stored with the token) and a secret access key that is *derived*, never
stored: base64(HMAC-SHA256(server key, "aerie-sigv4/" + access key id)), 40 characters. A SigV4
secret must be recoverable by the server (it recomputes every signature), unlike a bearer token,
which is kept only as a hash; deriving it keeps the same property for a copy of the database (no
usable secret in it) with nothing to decrypt. The server key is `AERIE_SIGV4_KEY` (hex; give every
replica of the API the same) or else 32 random bytes created in `$AERIE_HOME/sigv4.key` (mode
0600) on first use. Keep that key as safe as the database: with both, every AWS secret can be
recomputed; replacing it invalidates every AWS secret at once. Revoking or expiring the token
ends its access key with it.

Verification. botocore's own signer (`botocore.auth.SigV4Auth`) recomputes the signature over the
request as received — method, path, query string, exactly the headers the client signed, and the
SHA-256 of the body — with the secret derived for the access key id the client named, and the two
must match (compared in constant time). Every `x-amz-*` header and `host` must be signed. The
request's time (`X-Amz-Date`) must be within 15 minutes of the server's clock either way, as AWS
requires; within that window AWS does not refuse a repeated signature and neither does Aerie
(botocore itself sends identical signatures for identical calls made in the same second).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import re
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

from orchestrator.sagemaker_api.errors import (
    INCOMPLETE_SIGNATURE,
    INVALID_SIGNATURE,
    MISSING_AUTHENTICATION_TOKEN,
    AwsError,
)

ALGORITHM = "AWS4-HMAC-SHA256"
SIGV4_TIMESTAMP = "%Y%m%dT%H%M%SZ"
MAX_SKEW = timedelta(minutes=15)
ACCESS_KEY_PREFIX = "AKIA"
_BASE32 = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"
_ACCESS_KEY = re.compile(r"^AKIA[A-Z2-7]{16}$")
_DERIVATION = b"aerie-sigv4/"
UNSIGNED_PAYLOADS = {"UNSIGNED-PAYLOAD", "STREAMING-UNSIGNED-PAYLOAD-TRAILER"}


# --- credentials ---------------------------------------------------------------------------------


def new_access_key_id() -> str:
    return ACCESS_KEY_PREFIX + "".join(secrets.choice(_BASE32) for _ in range(16))


def is_access_key_id(value: str) -> bool:
    return bool(_ACCESS_KEY.match(value))


def derive_secret(server_key: bytes, access_key_id: str) -> str:
    digest = hmac.new(server_key, _DERIVATION + access_key_id.encode(), hashlib.sha256).digest()
    return base64.b64encode(digest).decode()[:40]


def load_server_key(configured: str | None, path: Path) -> bytes:
    """`AERIE_SIGV4_KEY` (hex) when set, else the key file, created (0600) on first use."""
    if configured:
        try:
            key = bytes.fromhex(configured.strip())
        except ValueError:
            raise ValueError("AERIE_SIGV4_KEY must be hex (e.g. `openssl rand -hex 32`)") from None
        if len(key) < 16:
            raise ValueError("AERIE_SIGV4_KEY must hold at least 16 bytes (32 hex digits)")
        return key
    try:
        return bytes.fromhex(path.read_text().strip())
    except FileNotFoundError:
        pass
    key = secrets.token_bytes(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(key.hex() + "\n")
    return key


# --- the Authorization header --------------------------------------------------------------------


@dataclass(frozen=True)
class Authorization:
    access_key_id: str
    date: str  # YYYYMMDD of the credential scope
    region: str
    service: str
    terminator: str
    signed_headers: tuple[str, ...]
    signature: str


def parse_authorization(header: str | None) -> Authorization:
    """The parts of `AWS4-HMAC-SHA256 Credential=…, SignedHeaders=…, Signature=…`."""
    if not header:
        raise AwsError(MISSING_AUTHENTICATION_TOKEN, "Missing Authentication Token", 403)
    algorithm, _, rest = header.strip().partition(" ")
    if algorithm != ALGORITHM:
        raise AwsError(
            INCOMPLETE_SIGNATURE,
            f"Authorization header requires the '{ALGORITHM}' algorithm (Signature Version 4), not {algorithm!r}.",
        )
    params: dict[str, str] = {}
    for part in rest.split(","):
        key, sep, value = part.strip().partition("=")
        if sep:
            params[key.strip()] = value.strip()
    missing = [k for k in ("Credential", "SignedHeaders", "Signature") if not params.get(k)]
    if missing:
        raise AwsError(
            INCOMPLETE_SIGNATURE,
            " ".join(f"Authorization header requires '{k}' parameter." for k in missing),
        )
    scope = params["Credential"].split("/")
    if len(scope) != 5 or not all(scope):
        raise AwsError(
            INCOMPLETE_SIGNATURE,
            "Credential must have exactly 5 slash-delimited elements, e.g. keyid/date/region/service/term, "
            f"got '{params['Credential']}'",
        )
    return Authorization(
        access_key_id=scope[0],
        date=scope[1],
        region=scope[2],
        service=scope[3],
        terminator=scope[4],
        signed_headers=tuple(params["SignedHeaders"].split(";")),
        signature=params["Signature"],
    )


# --- verification ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReceivedRequest:
    """What arrived: header names lower-cased, the path and query exactly as sent."""

    method: str
    raw_path: str
    query: str
    headers: tuple[tuple[str, str], ...]
    body: bytes

    def header(self, name: str) -> str | None:
        values = [v for k, v in self.headers if k == name]
        return ",".join(values) if values else None


def request_time(request: ReceivedRequest) -> datetime:
    value = request.header("x-amz-date")
    if not value:
        raise AwsError(
            INCOMPLETE_SIGNATURE, "Authorization header requires existence of either a 'X-Amz-Date' or a 'Date' header."
        )
    try:
        return datetime.strptime(value, SIGV4_TIMESTAMP).replace(tzinfo=timezone.utc)
    except ValueError:
        raise AwsError(INCOMPLETE_SIGNATURE, f"Date must be in ISO-8601 'basic format'. Got '{value}'.") from None


def check_scope(auth: Authorization, request: ReceivedRequest, service: str, now: datetime) -> None:
    """Everything but the signature: the scope names this service, the clock is within 15 minutes."""
    unsigned = sorted(
        {k for k, _ in request.headers if k.startswith("x-amz-") or k == "host"} - set(auth.signed_headers)
    )
    if unsigned:
        raise AwsError(INCOMPLETE_SIGNATURE, f"Header(s) {', '.join(unsigned)} must be signed (SignedHeaders).")
    when = request_time(request)
    stamp = when.strftime(SIGV4_TIMESTAMP)
    if auth.terminator != "aws4_request":
        raise AwsError(
            INVALID_SIGNATURE,
            f"Credential should be scoped with a valid terminator: 'aws4_request', not '{auth.terminator}'.",
        )
    if auth.service != service:
        raise AwsError(INVALID_SIGNATURE, f"Credential should be scoped to correct service: '{service}'.")
    if auth.date != stamp[:8]:
        raise AwsError(
            INVALID_SIGNATURE,
            "Date in Credential scope does not match YYYYMMDD from ISO-8601 version of date from HTTP: "
            f"'{auth.date}' != '{stamp[:8]}', from '{stamp}'.",
        )
    now_stamp = now.strftime(SIGV4_TIMESTAMP)
    if when < now - MAX_SKEW:
        raise AwsError(
            INVALID_SIGNATURE,
            f"Signature expired: {stamp} is now earlier than {(now - MAX_SKEW).strftime(SIGV4_TIMESTAMP)} "
            f"({now_stamp} - 15 min.)",
        )
    if when > now + MAX_SKEW:
        raise AwsError(
            INVALID_SIGNATURE,
            f"Signature not yet current: {stamp} is still later than {(now + MAX_SKEW).strftime(SIGV4_TIMESTAMP)} "
            f"({now_stamp} + 15 min.)",
        )


def expected_signature(auth: Authorization, request: ReceivedRequest, secret: str) -> str:
    """The signature botocore's SigV4Auth computes for this request with this secret."""
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    headers = {name: request.header(name) or "" for name in auth.signed_headers}
    host = headers.get("host") or request.header("host") or "localhost"
    url = f"http://{host}{request.raw_path}" + (f"?{request.query}" if request.query else "")
    aws_request = AWSRequest(method=request.method, url=url, headers=headers, data=request.body)
    aws_request.context["timestamp"] = request.header("x-amz-date") or ""
    signer = SigV4Auth(Credentials(auth.access_key_id, secret), auth.service, auth.region)
    if signer.signed_headers(signer.headers_to_sign(aws_request)) != ";".join(auth.signed_headers):
        return ""  # the client signed a header botocore never signs (or listed them out of order)
    canonical = signer.canonical_request(aws_request)
    return signer.signature(signer.string_to_sign(aws_request, canonical), aws_request)


def check_signature(auth: Authorization, request: ReceivedRequest, secret: str) -> None:
    declared = request.header("x-amz-content-sha256")
    if declared is not None and (
        declared in UNSIGNED_PAYLOADS or not hmac.compare_digest(declared, hashlib.sha256(request.body).hexdigest())
    ):
        raise AwsError(
            INVALID_SIGNATURE, "The provided 'x-amz-content-sha256' header does not match what was computed."
        )
    if not hmac.compare_digest(expected_signature(auth, request, secret), auth.signature):
        raise AwsError(
            INVALID_SIGNATURE,
            "The request signature we calculated does not match the signature you provided. Check your AWS "
            "Secret Access Key and signing method. Consult the service documentation for details.",
        )
