"""The SageMaker-compatible endpoint's door: `POST /` with `X-Amz-Target`, below FastAPI's routing.

AWS's JSON 1.1 protocol sends every operation to the service's root URL: `POST /`, the operation
in `X-Amz-Target` (`SageMaker.CreateTrainingJob`, `Logs_20140328.GetLogEvents`), the input as a
JSON body (`application/x-amz-json-1.1`), authenticated by a SigV4 `Authorization` header. This
ASGI middleware takes exactly those requests (a POST to `/` carrying `X-Amz-Target`) and passes
everything else on untouched, so it coexists with the REST API, the heartbeat fast path and the
dashboard's `GET /` redirect. The work (authentication, the store) runs in a worker thread.

A call goes: operation known? → Authorization parsed → access key known (its token live)? →
scope and clock → signature → role allowed, write rate → the operation in one transaction.
"""

from __future__ import annotations

import json
import logging
import uuid
from datetime import datetime, timezone
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Receive, Scope, Send

from orchestrator.principal import WRITERS, Principal
from orchestrator.sagemaker_api import logs, sigv4, training
from orchestrator.sagemaker_api.call import Call, EndpointSettings
from orchestrator.sagemaker_api.errors import (
    ACCESS_DENIED,
    CONTENT_TYPE,
    INTERNAL_FAILURE,
    SERIALIZATION,
    THROTTLING,
    UNKNOWN_OPERATION,
    UNRECOGNIZED_CLIENT,
    AwsError,
)
from orchestrator.store import repo

log = logging.getLogger("aerie.sagemaker_api")

# X-Amz-Target prefix -> (SigV4 signing name, the operations served).
SERVICES = {
    "SageMaker": ("sagemaker", training.OPERATIONS),
    "Logs_20140328": ("logs", logs.OPERATIONS),
}


class SageMakerGateway:
    def __init__(self, app: ASGIApp, api) -> None:
        self.app = app
        self.api = api  # the FastAPI application whose state holds the store, backends and caches

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] != "/":
            return await self.app(scope, receive, send)
        headers = tuple((k.decode("latin-1").lower(), v.decode("latin-1")) for k, v in scope["headers"])
        if not any(k == "x-amz-target" for k, _ in headers):
            return await self.app(scope, receive, send)
        body = await _read_body(receive)
        received = sigv4.ReceivedRequest(
            method="POST",
            raw_path=(scope.get("raw_path") or b"/").decode("latin-1"),
            query=(scope.get("query_string") or b"").decode("latin-1"),
            headers=headers,
            body=body,
        )
        request_id = str(uuid.uuid4())
        try:
            answer = await run_in_threadpool(self.handle, received)
            status, payload, extra = 200, json.dumps(answer, separators=(",", ":")).encode(), []
        except AwsError as exc:
            status, payload, extra = exc.status, exc.body(), exc.headers()
        except Exception:
            log.exception("SageMaker-compatible call failed (request %s)", request_id)
            err = AwsError(INTERNAL_FAILURE, "The request processing has failed because of an unknown error.", 500)
            status, payload, extra = err.status, err.body(), err.headers()
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", CONTENT_TYPE.encode()),
                    (b"content-length", str(len(payload)).encode()),
                    (b"x-amzn-requestid", request_id.encode()),
                    *extra,
                ],
            }
        )
        await send({"type": "http.response.body", "body": payload})

    # --- in a worker thread -------------------------------------------------------------------

    def handle(self, received: sigv4.ReceivedRequest) -> dict[str, Any]:
        state = self.api.state
        settings: EndpointSettings = state.sagemaker
        target = received.header("x-amz-target") or ""
        prefix, _, operation = target.partition(".")
        if prefix not in SERVICES:
            raise AwsError(UNKNOWN_OPERATION, f"Unknown operation {target!r}: this endpoint serves SageMaker and Logs.")
        signing_name, operations = SERVICES[prefix]
        auth = sigv4.parse_authorization(received.header("authorization"))
        who = self._principal(auth.access_key_id)
        sigv4.check_scope(auth, received, signing_name, datetime.now(timezone.utc))
        sigv4.check_signature(auth, received, sigv4.derive_secret(settings.server_key, auth.access_key_id))
        op = operations.get(operation)
        if op is None:
            raise AwsError(UNKNOWN_OPERATION, f"Unknown operation {operation!r} of {prefix}.")
        if op.writes:
            if who.kind not in WRITERS:
                raise AwsError(
                    ACCESS_DENIED,
                    f"User: aerie {who.kind} token {who.token_id} (tenant {who.tenant}) is not authorized to perform: "
                    f"{signing_name}:{operation} because a {who.kind} token is read-only",
                )
            if state.limiter.hit(who.token_id):
                raise AwsError(THROTTLING, "Rate exceeded")
        try:
            body = json.loads(received.body or b"{}")
        except ValueError:
            raise AwsError(SERIALIZATION, "The request body is not valid JSON.") from None
        if not isinstance(body, dict):
            raise AwsError(SERIALIZATION, "The request body must be a JSON object.")
        with state.db.session() as s:
            call = Call(
                session=s,
                who=who,
                region=auth.region,
                operation=operation,
                settings=settings,
                backends=state.backends,
                now=datetime.now(timezone.utc).timestamp(),
            )
            return op.fn(call, body)

    def _principal(self, access_key_id: str) -> Principal:
        """The token an access key belongs to (cached like bearer tokens, evicted on revoke)."""
        cache = self.api.state.tokens
        key = "sigv4:" + access_key_id
        who = cache.get(key)
        if who is not None:
            return who
        token = None
        if sigv4.is_access_key_id(access_key_id):
            with self.api.state.db.session() as s:
                token = repo.find_token_by_access_key(s, access_key_id)
                if token is not None:
                    who = Principal(token.kind, token.tenant, token.attempt_id, token.id)
                    expires_at = token.expires_at
        if token is None or who is None or who.kind == "agent":
            raise AwsError(UNRECOGNIZED_CLIENT, "The security token included in the request is invalid.")
        cache.put(key, expires_at, who)
        return who


async def _read_body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return b"".join(chunks)
