"""metric_points (the durable metrics series) and web_sessions (dashboard logins)

Revision ID: 0004
Revises: 0003
"""
from alembic import op
import sqlalchemy as sa

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

SERIES = ("loss", "grad_norm", "lr", "tokens_per_s", "mfu", "tokens_per_dollar")


def upgrade() -> None:
    op.create_table(
        "metric_points",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(length=80), nullable=False),
        sa.Column("attempt_id", sa.String(length=80), nullable=False),
        sa.Column("attempt_number", sa.Integer(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("t", sa.Float(), nullable=False),
        *[sa.Column(name, sa.Float(), nullable=True) for name in SERIES],
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("attempt_id", "step", name="uq_metric_step"),
    )
    with op.batch_alter_table("metric_points") as batch:
        batch.create_index(batch.f("ix_metric_points_job_id"), ["job_id"], unique=False)
    op.create_table(
        "web_sessions",
        sa.Column("id_hash", sa.String(length=64), nullable=False),
        sa.Column("token_id", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("expires_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(["token_id"], ["tokens.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id_hash"),
    )
    with op.batch_alter_table("web_sessions") as batch:
        batch.create_index(batch.f("ix_web_sessions_token_id"), ["token_id"], unique=False)


def downgrade() -> None:
    op.drop_table("web_sessions")
    op.drop_table("metric_points")
