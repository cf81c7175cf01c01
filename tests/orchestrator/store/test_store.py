"""The store on both SQLite and the real PostgreSQL: migrations, outbox, uniqueness, tokens."""

from __future__ import annotations

import pytest
from sqlalchemy import inspect
from sqlalchemy.exc import IntegrityError

from orchestrator.store import Database, repo


def test_migrations_build_every_table_and_are_idempotent(db, db_url):
    tables = set(inspect(db.engine).get_table_names())
    assert {"jobs", "attempts", "nodes", "verdicts", "events", "checkpoints", "tokens", "alembic_version"} <= tables
    Database(db_url).dispose()  # upgrading again is a no-op


def test_sqlite_runs_in_wal_mode(tmp_path):
    database = Database(f"sqlite:///{tmp_path / 'wal.db'}")
    with database.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
    database.dispose()


def test_state_changes_and_their_events_commit_together(db):
    with db.session() as s:
        job = repo.create_job(s, {"name": "j", "backend": "local"}, "default")
        job_id = job.id
    with pytest.raises(RuntimeError), db.session() as s:
        job = repo.get_job(s, "default", job_id)
        repo.set_job_state(s, job, "Failed", {"kind": "exit.nonzero"})
        raise RuntimeError("crash before commit")
    with db.session() as s:
        job = repo.get_job(s, "default", job_id)
        assert job.state == "Submitted"
        assert [e.detail["state"] for e in repo.list_events(s, job)] == ["Submitted"]


def test_one_attempt_per_number_is_enforced_by_the_store(db):
    with db.session() as s:
        job = repo.create_job(s, {"name": "j", "backend": "local"}, "default")
        repo.create_attempt(s, job, 1)
        job_id = job.id
    with pytest.raises(IntegrityError), db.session() as s:
        repo.create_attempt(s, repo.get_job(s, "default", job_id), 1)


def test_jobs_are_found_by_id_or_name_within_their_tenant(db):
    with db.session() as s:
        job = repo.create_job(s, {"name": "shared-name", "backend": "local"}, "team-a")
        job_id = job.id
    with db.session() as s:
        assert repo.get_job(s, "team-a", "shared-name").id == job_id
        assert repo.get_job(s, "team-a", job_id).id == job_id
        with pytest.raises(repo.NotFound):
            repo.get_job(s, "team-b", job_id)
        assert repo.list_jobs(s, "team-b") == []


def test_tokens_are_stored_hashed_and_expire(db):
    with db.session() as s:
        token = repo.mint_token(s, "admin")
        expired = repo.mint_token(s, "service", expires_at=1.0)
    with db.session() as s:
        row = repo.find_token(s, token)
        assert row is not None and row.token_hash != token and token not in row.token_hash
        assert repo.find_token(s, expired) is None
        assert repo.find_token(s, "aer_adm_not-a-token") is None


def test_events_have_the_eventbridge_shape(db):
    with db.session() as s:
        job = repo.create_job(s, {"name": "j", "backend": "local"}, "default")
        event = repo.eventbridge(repo.list_events(s, job)[0])
    assert event["version"] == "0" and event["source"] == "aerie.orchestrator"
    assert event["detail-type"] == "Aerie Job State Change"
    assert event["resources"] == [f"aerie:job/{job.id}"]
    assert event["detail"]["state"] == "Submitted"


def test_models_and_migrations_agree(db):
    """Autogenerate finds nothing to add: every model change came with its migration."""
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    from orchestrator.store.models import Base

    with db.engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    assert diff == []


def test_blame_is_recorded_once_per_attempt_and_host_and_clearing_keeps_the_history(db):
    blame = {"host": "algo-2", "kind": "silent.hang", "rule": "not_waiting", "why": "rank 3 busy", "evidence": {}}
    with db.session() as s:
        job = repo.create_job(s, {"name": "j", "backend": "local"}, "default")
        attempt = repo.create_attempt(s, job, 1)
        repo.record_blames(s, attempt, [blame])
        repo.record_blames(s, attempt, [{**blame, "why": "again"}, {**blame, "host": "algo-1"}])
        job_id = job.id
    with db.session() as s:
        job = repo.get_job(s, "default", job_id)
        rows = repo.blames_of(s, job)
        assert [(b.host, b.why) for b in rows] == [("algo-2", "rank 3 busy"), ("algo-1", "rank 3 busy")]
        assert repo.clear_blames(s, job, "algo-2", by="preflight:j-a2") == 1
        assert repo.clear_blames(s, job, "algo-2", by="preflight:j-a3") == 0
    with db.session() as s:
        rows = repo.blames_of(s, repo.get_job(s, "default", job_id))
        assert [(b.host, b.cleared_by) for b in rows] == [("algo-2", "preflight:j-a2"), ("algo-1", None)]
