"""Alembic environment: runs on the connection the caller passes (see store.db.upgrade)."""

from alembic import context
from sqlalchemy import create_engine

from orchestrator.store.models import Base

target_metadata = Base.metadata
config = context.config


def run() -> None:
    connection = config.attributes.get("connection")
    if connection is None:  # `alembic` CLI use: URL from the ini / -x url=...
        url = context.get_x_argument(as_dictionary=True).get("url") or config.get_main_option("sqlalchemy.url")
        if not url:
            raise RuntimeError("no database URL: pass -x url=... or set sqlalchemy.url in the ini")
        with create_engine(url).begin() as conn:
            context.configure(connection=conn, target_metadata=target_metadata, render_as_batch=True)
            with context.begin_transaction():
                context.run_migrations()
        return
    context.configure(connection=connection, target_metadata=target_metadata, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()


run()
