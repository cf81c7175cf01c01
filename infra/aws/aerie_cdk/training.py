"""The role SageMaker training jobs run as (passed in CreateTrainingJob's RoleArn).

It reads and writes only the checkpoint prefix (the spec's `checkpoint.s3_uri` and
`output.s3_uri` must live under it), pulls only the trainer image, and writes only SageMaker's
training-job log group. No managed policy: AmazonSageMakerFullAccess would give it the account.
"""

from __future__ import annotations

from aws_cdk import ArnFormat, Stack
from aws_cdk import aws_ecr as ecr
from aws_cdk import aws_iam as iam
from constructs import Construct

from .storage import CheckpointBucket

TRAINING_LOG_GROUP = "/aws/sagemaker/TrainingJobs"


def training_log_group_arn(stack: Stack, *, streams: bool) -> str:
    return stack.format_arn(
        service="logs",
        resource="log-group",
        resource_name=TRAINING_LOG_GROUP + (":log-stream:*" if streams else ""),
        arn_format=ArnFormat.COLON_RESOURCE_NAME,
    )


class SageMakerExecutionRole(Construct):
    def __init__(
        self, scope: Construct, cid: str, *, checkpoints: CheckpointBucket, trainer_repository: ecr.IRepository
    ) -> None:
        super().__init__(scope, cid)
        stack = Stack.of(self)
        self.role = iam.Role(
            self,
            "Role",
            assumed_by=iam.ServicePrincipal(
                "sagemaker.amazonaws.com",
                conditions={"StringEquals": {"aws:SourceAccount": stack.account}},
            ),
            description="Aerie training jobs: checkpoint prefix read/write, trainer image pull, training logs.",
        )
        checkpoints.grant(self.role, write=True)
        trainer_repository.grant_pull(self.role)
        self.role.add_to_principal_policy(
            iam.PolicyStatement(
                actions=["logs:CreateLogGroup", "logs:DescribeLogStreams"],
                resources=[training_log_group_arn(stack, streams=False)],
            )
        )
        self.role.add_to_principal_policy(
            iam.PolicyStatement(
                actions=["logs:CreateLogStream", "logs:PutLogEvents"],
                resources=[training_log_group_arn(stack, streams=True)],
            )
        )
