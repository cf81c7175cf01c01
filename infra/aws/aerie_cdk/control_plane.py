"""The control plane: `aerie up` in a Fargate service behind a public ALB, on RDS PostgreSQL.

Why ECS Fargate + ALB and not App Runner: the API must sit in the same VPC as the database in
private subnets, take a stable public endpoint for agents inside SageMaker jobs, keep
long-lived `logs -f` streams open, and run exactly the `aerie up` image used locally. Fargate
does all of that with plain VPC networking, native Secrets Manager injection and an ALB we
control (timeouts, HTTPS certificate, health checks); App Runner would need a VPC connector for
RDS and gives less control over timeouts and listeners.

Database credentials never enter the template: RDS generates them into Secrets Manager and ECS
injects them at task start as libpq's `PG*` variables, so `AERIE_DATABASE_URL` is the bare
`postgresql+psycopg://` and psycopg reads host, user and password from the environment.
"""

from __future__ import annotations

from aws_cdk import (
    Duration,
    RemovalPolicy,
    Stack,
)
from aws_cdk import (
    aws_certificatemanager as acm,
)
from aws_cdk import (
    aws_ec2 as ec2,
)
from aws_cdk import (
    aws_ecr as ecr,
)
from aws_cdk import (
    aws_ecs as ecs,
)
from aws_cdk import (
    aws_ecs_patterns as ecs_patterns,
)
from aws_cdk import (
    aws_elasticloadbalancingv2 as elbv2,
)
from aws_cdk import (
    aws_events as events,
)
from aws_cdk import (
    aws_iam as iam,
)
from aws_cdk import (
    aws_logs as logs,
)
from aws_cdk import (
    aws_rds as rds,
)
from aws_cdk import (
    aws_secretsmanager as secretsmanager,
)
from constructs import Construct

from aerie_contracts import env

from .settings import Settings
from .storage import CheckpointBucket
from .training import training_log_group_arn

CONTAINER_PORT = 8080
DATABASE_NAME = "aerie"


class ControlPlane(Construct):
    def __init__(
        self,
        scope: Construct,
        cid: str,
        *,
        settings: Settings,
        vpc: ec2.IVpc,
        repository: ecr.IRepository,
        checkpoints: CheckpointBucket,
        event_bus: events.IEventBus,
        sagemaker_role: iam.IRole,
        secrets: dict[str, secretsmanager.ISecret],
    ) -> None:
        super().__init__(scope, cid)
        stack = Stack.of(self)
        removal = RemovalPolicy.SNAPSHOT if settings.retain_data else RemovalPolicy.DESTROY

        self.database = rds.DatabaseInstance(
            self,
            "Database",
            engine=rds.DatabaseInstanceEngine.postgres(version=rds.PostgresEngineVersion.VER_17_9),
            instance_type=ec2.InstanceType(settings.db_instance_type),
            vpc=vpc,
            vpc_subnets=ec2.SubnetSelection(subnet_type=ec2.SubnetType.PRIVATE_ISOLATED),
            credentials=rds.Credentials.from_generated_secret("aerie", secret_name=f"{settings.name}/database"),
            database_name=DATABASE_NAME,
            multi_az=settings.db_multi_az,
            allocated_storage=settings.db_allocated_storage_gb,
            storage_encrypted=True,
            publicly_accessible=False,
            backup_retention=Duration.days(7),
            deletion_protection=settings.retain_data,
            removal_policy=removal,
            auto_minor_version_upgrade=True,
        )

        certificate = (
            acm.Certificate.from_certificate_arn(self, "Certificate", settings.certificate_arn)
            if settings.certificate_arn
            else None
        )
        log_group = logs.LogGroup(
            self,
            "Logs",
            log_group_name=f"/{settings.name}/controlplane",
            retention=logs.RetentionDays.ONE_MONTH,
            removal_policy=RemovalPolicy.DESTROY,
        )
        db_secret = self.database.secret
        assert db_secret is not None
        cluster = ecs.Cluster(
            self, "Cluster", vpc=vpc, cluster_name=settings.name, container_insights_v2=ecs.ContainerInsights.ENABLED
        )
        self.service = ecs_patterns.ApplicationLoadBalancedFargateService(
            self,
            "Service",
            cluster=cluster,
            service_name=f"{settings.name}-controlplane",
            cpu=settings.task_cpu,
            memory_limit_mib=settings.task_memory_mib,
            desired_count=settings.desired_count,
            public_load_balancer=True,
            open_listener=False,
            certificate=certificate,
            protocol=elbv2.ApplicationProtocol.HTTPS if certificate else elbv2.ApplicationProtocol.HTTP,
            redirect_http=bool(certificate),
            ssl_policy=elbv2.SslPolicy.RECOMMENDED_TLS if certificate else None,
            task_subnets=ec2.SubnetSelection(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS),
            assign_public_ip=False,
            circuit_breaker=ecs.DeploymentCircuitBreaker(rollback=True),
            min_healthy_percent=100,
            idle_timeout=Duration.minutes(10),
            task_image_options=ecs_patterns.ApplicationLoadBalancedTaskImageOptions(
                image=ecs.ContainerImage.from_ecr_repository(repository, settings.image_tag),
                container_port=CONTAINER_PORT,
                container_name="controlplane",
                log_driver=ecs.LogDrivers.aws_logs(stream_prefix="controlplane", log_group=log_group),
                environment={
                    env.DATABASE_URL: "postgresql+psycopg://",
                    "PGHOST": self.database.db_instance_endpoint_address,
                    "PGPORT": self.database.db_instance_endpoint_port,
                    "PGDATABASE": DATABASE_NAME,
                    "PGSSLMODE": "require",
                    env.EVENT_BUS: event_bus.event_bus_name,
                    env.CHECKPOINT_BUCKET: checkpoints.bucket.bucket_name,
                    env.CHECKPOINT_PREFIX: checkpoints.prefix,
                    env.SAGEMAKER_ROLE_ARN: sagemaker_role.role_arn,
                    "AWS_REGION": stack.region,
                },
                secrets={
                    "PGUSER": ecs.Secret.from_secrets_manager(db_secret, "username"),
                    "PGPASSWORD": ecs.Secret.from_secrets_manager(db_secret, "password"),
                    env.ADMIN_TOKEN: ecs.Secret.from_secrets_manager(secrets["admin_token"]),
                    env.SERVICE_TOKEN: ecs.Secret.from_secrets_manager(secrets["service_token"]),
                    "SLACK_SIGNING_SECRET": ecs.Secret.from_secrets_manager(secrets["slack_signing_secret"]),
                    "SLACK_BOT_TOKEN": ecs.Secret.from_secrets_manager(secrets["slack_bot_token"]),
                },
            ),
        )
        self.url = settings.public_url or (
            ("https://" if certificate else "http://") + self.service.load_balancer.load_balancer_dns_name
        )
        self.service.task_definition.default_container.add_environment(env.PUBLIC_URL, self.url)  # type: ignore[union-attr]

        # Reachability: the world (or ingress_cidr) -> ALB -> tasks -> database, nothing else.
        listener_port = 443 if certificate else 80
        self.service.load_balancer.connections.allow_from(
            ec2.Peer.ipv4(settings.ingress_cidr), ec2.Port.tcp(listener_port), "API clients and agents"
        )
        if certificate:
            self.service.load_balancer.connections.allow_from(
                ec2.Peer.ipv4(settings.ingress_cidr), ec2.Port.tcp(80), "redirect to HTTPS"
            )
        self.database.connections.allow_default_port_from(self.service.service, "control plane")
        self.service.target_group.configure_health_check(
            path=settings.health_check_path, healthy_http_codes="200", interval=Duration.seconds(15)
        )

        self._grant_task_role(self.service.task_definition.task_role, stack, event_bus, checkpoints, sagemaker_role)

    @staticmethod
    def _grant_task_role(
        role: iam.IRole,
        stack: Stack,
        event_bus: events.IEventBus,
        checkpoints: CheckpointBucket,
        sagemaker_role: iam.IRole,
    ) -> None:
        """What `aerie up` calls: its event bus, SageMaker training jobs, the checkpoint prefix (read),
        training logs."""
        event_bus.grant_put_events_to(role)
        checkpoints.grant(role)
        training_jobs = stack.format_arn(service="sagemaker", resource="training-job", resource_name="*")
        role.add_to_principal_policy(
            iam.PolicyStatement(
                actions=[
                    "sagemaker:CreateTrainingJob",
                    "sagemaker:DescribeTrainingJob",
                    "sagemaker:StopTrainingJob",
                    "sagemaker:AddTags",
                    "sagemaker:ListTags",
                ],
                resources=[training_jobs],
            )
        )
        role.add_to_principal_policy(iam.PolicyStatement(actions=["sagemaker:ListTrainingJobs"], resources=["*"]))
        role.add_to_principal_policy(
            iam.PolicyStatement(
                actions=["iam:PassRole"],
                resources=[sagemaker_role.role_arn],
                conditions={"StringEquals": {"iam:PassedToService": "sagemaker.amazonaws.com"}},
            )
        )
        role.add_to_principal_policy(
            iam.PolicyStatement(
                actions=["logs:DescribeLogStreams", "logs:GetLogEvents", "logs:FilterLogEvents"],
                resources=[training_log_group_arn(stack, streams=False), training_log_group_arn(stack, streams=True)],
            )
        )
