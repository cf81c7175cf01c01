"""The handlers' line to the control plane: the shared API client (`aerie_client`).

Where the API is and which token to use comes from the context (in-process delivery sets
`aerie_api`/`aerie_token`) or the environment: `AERIE_API`, and `AERIE_SERVICE_TOKEN` or, as the
CDK app configures the Lambda functions, `AERIE_SERVICE_TOKEN_ARN`, the Secrets Manager secret
holding it (read once per Lambda container with boto3, which the Lambda runtime provides, so the
token never sits in the function's configuration). `secret_setting` does the same for the Slack
secrets.
"""

from __future__ import annotations

import os
from typing import Any

import aerie_client
from aerie_client import ApiError
from aerie_contracts import env, routes

__all__ = ["Api", "ApiError", "secret_setting", "secret_value"]


class Api(aerie_client.Client):
    """The shared client, found from the handler's context or environment. No retries: a failed
    delivery is delivered again (the event bus, Lambda's own retry), and every handler is idempotent."""

    def __init__(self, base: str, token: str, timeout_s: float = 30.0):
        if not base or not token:
            raise RuntimeError("handler needs AERIE_API and AERIE_SERVICE_TOKEN (or a context that carries them)")
        super().__init__(base, token, timeout_s=timeout_s)

    @classmethod
    def from_context(cls, context: Any) -> Api:
        base = getattr(context, "aerie_api", "") or os.environ.get(env.API, "")
        token = getattr(context, "aerie_token", "") or secret_setting(env.SERVICE_TOKEN)
        return cls(base, token)

    def job(self, job_id: str) -> dict[str, Any]:
        job: dict[str, Any] = self.call("GET", routes.job(job_id))
        return job


_secrets: dict[str, str] = {}


def secret_setting(name: str, *fallbacks: str) -> str:
    """A secret the handler needs: the variable `name` (or a fallback variable), else the Secrets
    Manager secret named by `name` + `_ARN`, which is how the CDK app passes every secret to the
    Lambda functions (AERIE_SERVICE_TOKEN_ARN, AERIE_SLACK_BOT_TOKEN_ARN, AERIE_SLACK_SIGNING_SECRET_ARN)."""
    for var in (name, *fallbacks):
        if os.environ.get(var):
            return os.environ[var]
    arn = os.environ.get(f"{name}_ARN")
    return secret_value(arn) if arn else ""


def secret_value(secret_id: str) -> str:
    """A Secrets Manager secret's string, fetched once per process (a Lambda container)."""
    if secret_id not in _secrets:
        import boto3

        _secrets[secret_id] = boto3.client("secretsmanager").get_secret_value(SecretId=secret_id)["SecretString"]
    return _secrets[secret_id]
