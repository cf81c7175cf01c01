"""node_blames: which node chaining blamed for which failed attempt, and when the blame was cleared

Revision ID: 0005_node_blames
Revises: 0004
"""
from alembic import op
import sqlalchemy as sa

revision = "0005_node_blames"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "node_blames",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(length=80), nullable=False),
        sa.Column("attempt_id", sa.String(length=80), nullable=False),
        sa.Column("host", sa.String(length=128), nullable=False),
        sa.Column("kind", sa.String(length=64), nullable=False),
        sa.Column("rule", sa.String(length=32), nullable=False),
        sa.Column("why", sa.Text(), nullable=False),
        sa.Column("evidence", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("cleared_at", sa.Float(), nullable=True),
        sa.Column("cleared_by", sa.String(length=128), nullable=True),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["attempt_id"], ["attempts.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("attempt_id", "host", name="uq_blame_attempt_host"),
    )
    with op.batch_alter_table("node_blames") as batch:
        batch.create_index(batch.f("ix_node_blames_job_id"), ["job_id"], unique=False)


def downgrade() -> None:
    op.drop_table("node_blames")
