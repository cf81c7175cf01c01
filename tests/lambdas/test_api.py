"""How a handler finds its token in AWS Lambda: the Secrets Manager ARN the CDK app gives it."""

from __future__ import annotations

import boto3
import pytest

from lambdas import api


def test_the_token_is_read_from_secrets_manager_once(s3_env, monkeypatch):
    """moto's Secrets Manager on loopback (AWS's own service cannot run here)."""
    arn = boto3.client("secretsmanager").create_secret(Name="aerie/service-token-t1", SecretString="tok-1")["ARN"]
    monkeypatch.delenv("AERIE_SERVICE_TOKEN", raising=False)
    monkeypatch.setenv("AERIE_API", "http://api.example")
    monkeypatch.setenv("AERIE_SERVICE_TOKEN_ARN", arn)
    monkeypatch.setattr(api, "_secrets", {})
    assert api.Api.from_context(object()).token == "tok-1"
    boto3.client("secretsmanager").put_secret_value(SecretId=arn, SecretString="tok-2")
    assert api.Api.from_context(object()).token == "tok-1"  # one read per Lambda container


def test_the_context_and_a_plain_variable_come_first(monkeypatch):
    monkeypatch.setenv("AERIE_SERVICE_TOKEN_ARN", "arn:aws:secretsmanager:us-east-1:1:secret:never-read")
    monkeypatch.setenv("AERIE_API", "http://api.example")
    monkeypatch.setenv("AERIE_SERVICE_TOKEN", "plain")
    assert api.Api.from_context(object()).token == "plain"

    class Ctx:
        aerie_api, aerie_token = "http://in-process", "ctx"

    assert api.Api.from_context(Ctx()).token == "ctx"
    monkeypatch.delenv("AERIE_SERVICE_TOKEN")
    monkeypatch.delenv("AERIE_SERVICE_TOKEN_ARN")
    with pytest.raises(RuntimeError, match="AERIE_SERVICE_TOKEN"):
        api.Api.from_context(object())


def test_the_slack_secrets_come_from_secrets_manager_in_lambda(s3_env, monkeypatch):
    """eval_dispatch and slack_interactions get the Slack secrets as ARNs too (infra/aws handlers.py)."""
    from lambdas.slack_interactions import web_client

    sm = boto3.client("secretsmanager")
    bot = sm.create_secret(Name="aerie/slack-bot-token-t1", SecretString="xoxb-from-sm")["ARN"]
    for var in ("SLACK_BOT_TOKEN", "AERIE_SLACK_BOT_TOKEN", "SLACK_SIGNING_SECRET", "AERIE_SLACK_SIGNING_SECRET"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AERIE_SLACK_BOT_TOKEN_ARN", bot)
    monkeypatch.setattr(api, "_secrets", {})
    assert web_client().token == "xoxb-from-sm"
    assert api.secret_setting("AERIE_SLACK_SIGNING_SECRET", "SLACK_SIGNING_SECRET") == ""  # none configured
