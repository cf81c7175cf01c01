"""nodes.preflight: the node's pre-flight result for its attempt (aerie_contracts.preflight)

Revision ID: 0009_node_preflight
Revises: 0008_checkpoint_tier
"""
from alembic import op
import sqlalchemy as sa

revision = "0009_node_preflight"
down_revision = "0008_checkpoint_tier"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("nodes") as batch:
        batch.add_column(sa.Column("preflight", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("nodes") as batch:
        batch.drop_column("preflight")
