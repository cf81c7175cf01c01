"""eval_samples and ratings: the human eval loop in Slack

Revision ID: 0003
Revises: 0002
"""
from alembic import op
import sqlalchemy as sa

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "eval_samples",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("job_id", sa.String(length=80), nullable=False),
        sa.Column("attempt_id", sa.String(length=80), nullable=True),
        sa.Column("checkpoint_uri", sa.Text(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("prompt_index", sa.Integer(), nullable=False),
        sa.Column("prompt", sa.Text(), nullable=False),
        sa.Column("answer", sa.Text(), nullable=False),
        sa.Column("meta", sa.JSON(), nullable=False),
        sa.Column("slack_channel", sa.String(length=128), nullable=True),
        sa.Column("slack_ts", sa.String(length=64), nullable=True),
        sa.Column("claim", sa.String(length=64), nullable=True),
        sa.Column("claimed_at", sa.Float(), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("posted_at", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("job_id", "checkpoint_uri", "prompt_index", name="uq_eval_sample"),
    )
    with op.batch_alter_table("eval_samples") as batch:
        batch.create_index(batch.f("ix_eval_samples_job_id"), ["job_id"], unique=False)
    op.create_table(
        "ratings",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("sample_id", sa.String(length=40), nullable=False),
        sa.Column("user_id", sa.String(length=64), nullable=False),
        sa.Column("user_name", sa.String(length=128), nullable=False),
        sa.Column("score", sa.Integer(), nullable=True),
        sa.Column("hallucination", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(["sample_id"], ["eval_samples.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("sample_id", "user_id", name="uq_rating_user"),
    )
    with op.batch_alter_table("ratings") as batch:
        batch.create_index(batch.f("ix_ratings_sample_id"), ["sample_id"], unique=False)


def downgrade() -> None:
    op.drop_table("ratings")
    op.drop_table("eval_samples")
