"""checkpoints.tier: which tier a recorded checkpoint lives in (s3, memory)

Revision ID: 0008_checkpoint_tier
Revises: 0007_checkpoint_state_reason
"""
from alembic import op
import sqlalchemy as sa

revision = "0008_checkpoint_tier"
down_revision = "0007_checkpoint_state_reason"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("checkpoints") as batch:
        batch.add_column(sa.Column("tier", sa.String(length=16), nullable=False, server_default="s3"))


def downgrade() -> None:
    with op.batch_alter_table("checkpoints") as batch:
        batch.drop_column("tier")
