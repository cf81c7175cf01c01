"""The four `lambdas/` handlers as Lambda functions, and what triggers them.

- `chain_restart`: Aerie's own failed attempts (custom bus) and SageMaker's training-job state
  changes (default bus, where AWS services publish) to Failed/Stopped/Completed.
- `checkpoint_gc`, `eval_dispatch`: "Aerie Checkpoint Committed".
- `slack_interactions`: `POST /v1/slack/interactions` on an HTTP API (the same path as the
  control plane's route); Slack signs each request and the handler verifies the signature.

Every function gets its own role with only what it calls, its own log group (no
AWSLambdaBasicExecutionRole, whose log statements apply to every log group), and failures that
exhaust retries land in one dead-letter queue so no event is silently dropped.
"""

from __future__ import annotations

from dataclasses import dataclass

from aws_cdk import (
    Duration,
    RemovalPolicy,
)
from aws_cdk import (
    aws_apigatewayv2 as apigwv2,
)
from aws_cdk import (
    aws_apigatewayv2_integrations as integrations,
)
from aws_cdk import (
    aws_events as events,
)
from aws_cdk import (
    aws_events_targets as targets,
)
from aws_cdk import (
    aws_iam as iam,
)
from aws_cdk import (
    aws_lambda as lambda_,
)
from aws_cdk import (
    aws_lambda_destinations as destinations,
)
from aws_cdk import (
    aws_logs as logs,
)
from aws_cdk import (
    aws_secretsmanager as secretsmanager,
)
from aws_cdk import (
    aws_sqs as sqs,
)
from constructs import Construct

from aerie_contracts import env
from aerie_contracts import events as contract_events

from .storage import CheckpointBucket


def event_pattern(pattern: dict) -> events.EventPattern:
    """A CDK EventPattern from an EventBridge pattern (JSON keys) defined in aerie_contracts."""
    return events.EventPattern(
        source=pattern["source"], detail_type=pattern["detail-type"], detail=pattern.get("detail")
    )


# What the control plane publishes (orchestrator/eventbus.py) and what these rules filter on
# come from one definition.
AERIE_SOURCE = contract_events.SOURCE
ATTEMPT_FAILED = event_pattern(contract_events.ATTEMPT_FAILED_PATTERN)
CHECKPOINT_COMMITTED = event_pattern(contract_events.CHECKPOINT_COMMITTED_PATTERN)
SAGEMAKER_JOB_ENDED = event_pattern(contract_events.SAGEMAKER_JOB_ENDED_PATTERN)
SLACK_ROUTE = "/v1/slack/interactions"


@dataclass(frozen=True)
class HandlerSpec:
    module: str
    timeout_s: int
    memory_mb: int
    checkpoint_access: str  # "", "read" or "delete"
    secrets: tuple[str, ...]  # keys of SECRET_ARN


# The variable each secret's ARN reaches a handler in (lambdas.api.secret_setting reads `<name>_ARN`).
SECRET_ARN = {
    "service_token": env.SERVICE_TOKEN_ARN,
    "slack_bot_token": env.SLACK_BOT_TOKEN_ARN,
    "slack_signing_secret": env.SLACK_SIGNING_SECRET_ARN,
}

HANDLERS = (
    HandlerSpec("chain_restart", 60, 256, "read", ("service_token",)),
    HandlerSpec("checkpoint_gc", 300, 256, "delete", ("service_token",)),
    HandlerSpec("eval_dispatch", 300, 512, "read", ("service_token", "slack_bot_token")),
    # Slack wants an answer within 3 s; the handler acknowledges and updates the message itself.
    HandlerSpec("slack_interactions", 10, 256, "", ("service_token", "slack_signing_secret", "slack_bot_token")),
)


class Handlers(Construct):
    def __init__(
        self,
        scope: Construct,
        cid: str,
        *,
        name: str,
        code: lambda_.Code,
        api_url: str,
        aerie_bus: events.IEventBus,
        checkpoints: CheckpointBucket,
        secrets: dict[str, secretsmanager.ISecret],
    ) -> None:
        super().__init__(scope, cid)
        self.dead_letters = sqs.Queue(
            self,
            "DeadLetters",
            queue_name=f"{name}-handler-dead-letters",
            encryption=sqs.QueueEncryption.SQS_MANAGED,
            enforce_ssl=True,
            retention_period=Duration.days(14),
        )
        self.functions: dict[str, lambda_.Function] = {}
        for spec in HANDLERS:
            self.functions[spec.module] = self._function(spec, name, code, api_url, checkpoints, secrets)

        target_options = dict(dead_letter_queue=self.dead_letters, retry_attempts=8, max_event_age=Duration.hours(6))
        chain_restart = targets.LambdaFunction(self.functions["chain_restart"], **target_options)
        events.Rule(
            self,
            "AttemptFailed",
            event_bus=aerie_bus,
            event_pattern=ATTEMPT_FAILED,
            targets=[chain_restart],
            description="Failed Aerie attempts -> chain_restart",
        )
        # SageMaker publishes only to the account's default bus.
        events.Rule(
            self,
            "SageMakerTrainingJobEnded",
            event_pattern=SAGEMAKER_JOB_ENDED,
            targets=[chain_restart],
            description="SageMaker training jobs that ended -> chain_restart (it ignores jobs Aerie did not start)",
        )
        events.Rule(
            self,
            "CheckpointCommitted",
            event_bus=aerie_bus,
            event_pattern=CHECKPOINT_COMMITTED,
            targets=[
                targets.LambdaFunction(self.functions["checkpoint_gc"], **target_options),
                targets.LambdaFunction(self.functions["eval_dispatch"], **target_options),
            ],
            description="Committed checkpoints -> checkpoint_gc and eval_dispatch",
        )

        self.slack_api = apigwv2.HttpApi(self, "SlackApi", api_name=f"{name}-slack", create_default_stage=False)
        apigwv2.HttpStage(
            self,
            "SlackApiStage",
            http_api=self.slack_api,
            stage_name="$default",
            auto_deploy=True,
            throttle=apigwv2.ThrottleSettings(rate_limit=50, burst_limit=100),
        )
        self.slack_api.add_routes(
            path=SLACK_ROUTE,
            methods=[apigwv2.HttpMethod.POST],
            integration=integrations.HttpLambdaIntegration("SlackInteractions", self.functions["slack_interactions"]),
        )
        self.slack_url = self.slack_api.api_endpoint + SLACK_ROUTE

    def _function(
        self,
        spec: HandlerSpec,
        name: str,
        code: lambda_.Code,
        api_url: str,
        checkpoints: CheckpointBucket,
        secrets: dict[str, secretsmanager.ISecret],
    ) -> lambda_.Function:
        cid = "".join(part.title() for part in spec.module.split("_"))
        role = iam.Role(self, f"{cid}Role", assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"))
        log_group = logs.LogGroup(
            self,
            f"{cid}Logs",
            log_group_name=f"/{name}/lambda/{spec.module}",
            retention=logs.RetentionDays.ONE_MONTH,
            removal_policy=RemovalPolicy.DESTROY,
        )
        log_group.grant_write(role)
        environment = {
            env.API: api_url,
            env.CHECKPOINT_BUCKET: checkpoints.bucket.bucket_name,
            env.CHECKPOINT_PREFIX: checkpoints.prefix,
        }
        for key in spec.secrets:
            secrets[key].grant_read(role)
            # The handler reads the value at run time (boto3), so it never sits in the function config.
            environment[SECRET_ARN[key]] = secrets[key].secret_arn
        if spec.checkpoint_access:
            checkpoints.grant(role, delete=spec.checkpoint_access == "delete")
        function = lambda_.Function(
            self,
            cid,
            function_name=f"{name}-{spec.module.replace('_', '-')}",
            description=f"Aerie handler lambdas/{spec.module}.py",
            runtime=lambda_.Runtime.PYTHON_3_12,
            architecture=lambda_.Architecture.ARM_64,
            handler=f"lambdas.{spec.module}.handler",
            code=code,
            role=role,
            log_group=log_group,
            timeout=Duration.seconds(spec.timeout_s),
            memory_size=spec.memory_mb,
            environment=environment,
        )
        function.configure_async_invoke(retry_attempts=2, on_failure=destinations.SqsDestination(self.dead_letters))
        return function
