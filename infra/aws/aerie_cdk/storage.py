"""The checkpoint bucket and the IAM statements that reach one prefix of it."""

from __future__ import annotations

from aws_cdk import Duration, RemovalPolicy
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3 as s3
from constructs import Construct

READ_ACTIONS = ("s3:GetObject", "s3:GetObjectAttributes")
# Multipart uploads (DCP shards, s3torchconnector) need the abort/list-parts pair besides PutObject.
WRITE_ACTIONS = ("s3:PutObject", "s3:AbortMultipartUpload", "s3:ListMultipartUploadParts")
DELETE_ACTIONS = ("s3:DeleteObject",)


class CheckpointBucket(Construct):
    """Private, SSL-only, unversioned (checkpoints are immutable; GC deletes for real).

    Lifecycle: incomplete multipart uploads (a rank killed mid-save) are aborted after a day so
    their parts stop costing money; whole-object expiry is optional because `checkpoint_gc`
    already applies each job's keep_last/keep_every.
    """

    def __init__(self, scope: Construct, cid: str, *, prefix: str, expire_days: int, retain: bool) -> None:
        super().__init__(scope, cid)
        self.prefix = prefix
        rules = [
            s3.LifecycleRule(id="abort-incomplete-uploads", abort_incomplete_multipart_upload_after=Duration.days(1))
        ]
        if expire_days > 0:
            rules.append(
                s3.LifecycleRule(id="expire-checkpoints", prefix=prefix, expiration=Duration.days(expire_days))
            )
        self.bucket = s3.Bucket(
            self,
            "Bucket",
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            encryption=s3.BucketEncryption.S3_MANAGED,
            enforce_ssl=True,
            versioned=False,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
            lifecycle_rules=rules,
            removal_policy=RemovalPolicy.RETAIN if retain else RemovalPolicy.DESTROY,
        )

    def objects_arn(self) -> str:
        return self.bucket.arn_for_objects(self.prefix + "*")

    def statements(self, *, write: bool = False, delete: bool = False) -> list[iam.PolicyStatement]:
        """Least-privilege access to the checkpoint prefix only: list it, read it, optionally write/delete."""
        actions = list(READ_ACTIONS)
        if write:
            actions += WRITE_ACTIONS
        if delete:
            actions += DELETE_ACTIONS
        return [
            iam.PolicyStatement(
                actions=["s3:ListBucket"],
                resources=[self.bucket.bucket_arn],
                conditions={"StringLike": {"s3:prefix": [self.prefix + "*"]}},
            ),
            iam.PolicyStatement(actions=["s3:GetBucketLocation"], resources=[self.bucket.bucket_arn]),
            iam.PolicyStatement(actions=actions, resources=[self.objects_arn()]),
        ]

    def grant(self, role: iam.IRole, *, write: bool = False, delete: bool = False) -> None:
        for statement in self.statements(write=write, delete=delete):
            role.add_to_principal_policy(statement)
