"""One stack with everything Aerie needs in an AWS account.

Names and sizes come from context (see `settings.py`). The images are not built here (no
Docker at synth time): they are pushed to two ECR repositories first, by the commands in
the README's "Deploy to AWS" section, and referenced by name and tag.
"""

from __future__ import annotations

from pathlib import Path

from aws_cdk import (
    CfnOutput,
    Duration,
    Stack,
)
from aws_cdk import (
    aws_ec2 as ec2,
)
from aws_cdk import (
    aws_ecr as ecr,
)
from aws_cdk import (
    aws_events as events,
)
from aws_cdk import (
    aws_lambda as lambda_,
)
from aws_cdk import (
    aws_secretsmanager as secretsmanager,
)
from constructs import Construct

from .bundle import stage_handler_bundle
from .control_plane import ControlPlane
from .handlers import AERIE_SOURCE, Handlers
from .settings import Settings
from .storage import CheckpointBucket
from .training import SageMakerExecutionRole

# Secrets the deployer fills in after the first deploy (`aws secretsmanager put-secret-value`).
# Their first values are random, so nothing works by accident with a guessable default.
SECRETS = {
    "admin_token": "Aerie admin API token (`export AERIE_TOKEN=...` for the CLI).",
    "service_token": "Bearer token the handlers use to call the Aerie API.",
    "slack_signing_secret": "Slack app signing secret (Basic Information > App Credentials).",
    "slack_bot_token": "Slack bot token (xoxb-...) for chat.postMessage / chat.update.",
}


class AerieStack(Stack):
    def __init__(self, scope: Construct, cid: str, *, settings: Settings, bundle_dir: Path, **kwargs) -> None:
        super().__init__(scope, cid, description="Aerie: control plane, checkpoint bucket, event handlers", **kwargs)
        self.settings = settings

        vpc = ec2.Vpc(
            self,
            "Vpc",
            max_azs=2,
            nat_gateways=settings.nat_gateways,
            subnet_configuration=[
                ec2.SubnetConfiguration(name="public", subnet_type=ec2.SubnetType.PUBLIC, cidr_mask=24),
                ec2.SubnetConfiguration(name="app", subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS, cidr_mask=22),
                ec2.SubnetConfiguration(name="data", subnet_type=ec2.SubnetType.PRIVATE_ISOLATED, cidr_mask=24),
            ],
        )
        # S3 traffic from the control plane stays off the NAT gateway.
        vpc.add_gateway_endpoint("S3Endpoint", service=ec2.GatewayVpcEndpointAwsService.S3)

        self.checkpoints = CheckpointBucket(
            self,
            "Checkpoints",
            prefix=settings.checkpoint_prefix,
            expire_days=settings.checkpoint_expire_days,
            retain=settings.retain_data,
        )
        self.event_bus = events.EventBus(self, "EventBus", event_bus_name=settings.name)
        self.event_bus.archive(
            "EventArchive",
            archive_name=f"{settings.name}-events",
            event_pattern=events.EventPattern(source=[AERIE_SOURCE]),
            retention=Duration.days(14),
        )
        self.secrets: dict[str, secretsmanager.ISecret] = {
            key: secretsmanager.Secret(
                self,
                "".join(part.title() for part in key.split("_")),
                secret_name=f"{settings.name}/{key.replace('_', '-')}",
                description=description,
                generate_secret_string=secretsmanager.SecretStringGenerator(
                    exclude_punctuation=True, password_length=48
                ),
            )
            for key, description in SECRETS.items()
        }

        trainer_repository = ecr.Repository.from_repository_name(self, "TrainerRepository", settings.trainer_repository)
        self.sagemaker = SageMakerExecutionRole(
            self, "SageMakerExecution", checkpoints=self.checkpoints, trainer_repository=trainer_repository
        )
        self.control_plane = ControlPlane(
            self,
            "ControlPlane",
            settings=settings,
            vpc=vpc,
            repository=ecr.Repository.from_repository_name(
                self, "ControlPlaneRepository", settings.control_plane_repository
            ),
            checkpoints=self.checkpoints,
            event_bus=self.event_bus,
            sagemaker_role=self.sagemaker.role,
            secrets=self.secrets,
        )
        self.handlers = Handlers(
            self,
            "Handlers",
            name=settings.name,
            code=lambda_.Code.from_asset(str(stage_handler_bundle(bundle_dir))),
            api_url=self.control_plane.url,
            aerie_bus=self.event_bus,
            checkpoints=self.checkpoints,
            secrets=self.secrets,
        )

        outputs = {
            "ApiUrl": self.control_plane.url,
            "SlackInteractionsUrl": self.handlers.slack_url,
            "CheckpointS3Uri": f"s3://{self.checkpoints.bucket.bucket_name}/{settings.checkpoint_prefix}",
            "SageMakerRoleArn": self.sagemaker.role.role_arn,
            "EventBusName": self.event_bus.event_bus_name,
            "HandlerDeadLetterQueueUrl": self.handlers.dead_letters.queue_url,
            "TrainerImage": f"{trainer_repository.repository_uri}:{settings.image_tag}",
        }
        for key, value in outputs.items():
            CfnOutput(self, key, value=value)
        for key, secret in self.secrets.items():
            CfnOutput(self, "".join(p.title() for p in key.split("_")) + "SecretArn", value=secret.secret_arn)
