"""Durable state: SQLAlchemy models, Alembic migrations and the data-access layer (`repo`)."""

from orchestrator.store.db import Database, make_engine, upgrade

__all__ = ["Database", "make_engine", "upgrade"]
