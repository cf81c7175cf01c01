"""checkpoints.reason and checkpoints.state_at: why and when a checkpoint row left `good`

Revision ID: 0007_checkpoint_state_reason
Revises: 0006_sagemaker_api
"""
from alembic import op
import sqlalchemy as sa

revision = "0007_checkpoint_state_reason"
down_revision = "0006_sagemaker_api"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("checkpoints") as batch:
        batch.add_column(sa.Column("reason", sa.Text(), nullable=True))
        batch.add_column(sa.Column("state_at", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("checkpoints") as batch:
        batch.drop_column("state_at")
        batch.drop_column("reason")
