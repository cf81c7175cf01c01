"""Shared fixtures: isolated Aerie homes and real databases (SQLite file, PostgreSQL on loopback)."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

PG_ADMIN_URL = os.environ.get("AERIE_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/test")

# The loopback S3 server fixtures (moto), shared by the checkpoint and chaining tests; the live API
# and the Slack stand-in, shared by the handler tests; the whole-job tests' control plane.
pytest_plugins = ["tests.fixtures.s3", "tests.fixtures.live", "tests.fixtures.planes", "tests.fixtures.leaks"]

TESTS = Path(__file__).resolve().parent
# Whole jobs on real control planes, Slurm and browsers: their detectors run on tight thresholds
# (a 12 s hang floor, "busy" = a rank above 50 % CPU), so they run one at a time (`make test`'s
# second phase), never beside another job.
SERIAL_DIRS = {"e2e", "integration", "chaos", "browser"}


def pytest_ignore_collect(collection_path, config):
    """`make test`'s jobs phase (`-m serial`, and beside it `-m beside_serial`) does not import the
    modules that cannot hold one of its tests: outside SERIAL_DIRS only a `slow` mark makes one, and
    importing the rest (the API fuzzer's schemathesis, torch, transformers) was most of that phase's
    collection time."""
    if config.getoption("markexpr", "") not in ("serial", "beside_serial") or collection_path.suffix != ".py":
        return None
    if not collection_path.name.startswith("test_"):
        return None
    parts = collection_path.resolve().relative_to(TESTS).parts
    if parts[0] in SERIAL_DIRS or "mark.slow" in collection_path.read_text():
        return None
    return True


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Mark `serial` every test that runs whole jobs (see SERIAL_DIRS, and anything `slow`) unless
    it is `side_by_side` (with the unit tests) or `beside_serial` (the clean run). `make test` runs
    the serial ones one after another in one pytest process, never beside each other, with the
    clean run in a second process beside them; then the rest on two xdist workers."""
    for item in items:
        if item.get_closest_marker("side_by_side") or item.get_closest_marker("beside_serial"):
            continue
        top = Path(str(item.fspath)).resolve().relative_to(TESTS).parts[0]
        if top in SERIAL_DIRS or item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.serial)
    # The whole-job tests of the unit phase (tens of seconds each) first, so that none is left for
    # the end of the phase, where one worker would run it while the other has nothing left to do.
    items.sort(key=lambda item: 0 if item.get_closest_marker("side_by_side") else 1)


@pytest.fixture
def aerie_home(tmp_path, monkeypatch):
    """A fresh AERIE_HOME so no test sees another's store, token or jobs."""
    home = tmp_path / "aerie-home"
    home.mkdir()
    monkeypatch.setenv("AERIE_HOME", str(home))
    for var in ("AERIE_DATABASE_URL", "AERIE_API", "AERIE_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    return home


@pytest.fixture
def pg_url():
    """A PostgreSQL database of its own on the local server, dropped afterwards."""
    from sqlalchemy import create_engine, text

    name = f"aerie_test_{uuid.uuid4().hex[:10]}"
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
    except Exception as exc:  # the suite needs the real server; say how to start it
        pytest.fail(
            f"PostgreSQL at {PG_ADMIN_URL} is not usable ({exc}); start it with "
            "'pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start'"
        )
    url = PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
    yield url
    with admin.connect() as conn:
        conn.execute(text(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}'"))
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}"'))
    admin.dispose()


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request, tmp_path):
    """Each store test runs on both supported databases."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'aerie.db'}"
    return request.getfixturevalue("pg_url")
