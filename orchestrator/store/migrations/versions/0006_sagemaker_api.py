"""sagemaker_training_jobs (jobs created through the SageMaker-compatible endpoint) and
tokens.access_key_id (an API token's AWS access key id, for SigV4)

Revision ID: 0006_sagemaker_api
Revises: 0005_node_blames
"""
from alembic import op
import sqlalchemy as sa

revision = "0006_sagemaker_api"
down_revision = "0005_node_blames"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "sagemaker_training_jobs",
        sa.Column("job_id", sa.String(length=80), nullable=False),
        sa.Column("tenant", sa.String(length=64), nullable=False),
        sa.Column("name", sa.String(length=63), nullable=False),
        sa.Column("arn", sa.String(length=256), nullable=False),
        sa.Column("region", sa.String(length=32), nullable=False),
        sa.Column("request", sa.JSON(), nullable=False),
        sa.Column("tags", sa.JSON(), nullable=False),
        sa.Column("warnings", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("job_id"),
        sa.UniqueConstraint("tenant", "arn", name="uq_sagemaker_job_arn"),
    )
    with op.batch_alter_table("tokens") as batch:
        batch.add_column(sa.Column("access_key_id", sa.String(length=32), nullable=True))
        batch.create_index(batch.f("ix_tokens_access_key_id"), ["access_key_id"], unique=True)


def downgrade() -> None:
    with op.batch_alter_table("tokens") as batch:
        batch.drop_index(batch.f("ix_tokens_access_key_id"))
        batch.drop_column("access_key_id")
    op.drop_table("sagemaker_training_jobs")
