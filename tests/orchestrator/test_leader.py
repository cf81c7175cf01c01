"""One leader per store: two control planes on one PostgreSQL, and takeover when the leader dies."""

from __future__ import annotations

import time

import pytest
from sqlalchemy import create_engine

from devtools.harness.control_plane import ControlPlane, write_spec
from orchestrator.leader import FileLeaderLock, PostgresLeaderLock


def test_postgres_advisory_lock_has_one_holder_and_passes_on(pg_url):
    e1, e2 = create_engine(pg_url), create_engine(pg_url)
    first, second = PostgresLeaderLock(e1), PostgresLeaderLock(e2)
    assert first.try_acquire() and first.still_held()
    assert not second.try_acquire()
    first.release()
    assert second.try_acquire()
    second.release()
    e1.dispose()
    e2.dispose()


def test_file_lock_has_one_holder(tmp_path):
    a, b = FileLeaderLock(tmp_path / "leader.lock"), FileLeaderLock(tmp_path / "leader.lock")
    assert a.try_acquire()
    assert not b.try_acquire()
    a.release()
    assert b.try_acquire()
    b.release()


@pytest.mark.slow
def test_two_control_planes_one_leads_the_other_takes_over(tmp_path, pg_url):
    env = {"AERIE_DATABASE_URL": pg_url}
    planes = []
    for i in (1, 2):
        home = tmp_path / f"home{i}"
        home.mkdir()
        planes.append(ControlPlane(home, extra_env=env).start())
    first, second = planes
    try:
        spec = write_spec(
            tmp_path / "job.json",
            name="led",
            entrypoint=["python", "tests/e2e/contract_check.py"],
            resources={"instance_count": 1, "procs_per_node": 1},
        )
        second.cli("submit", str(spec), check=True)  # any API process accepts work
        job = second.wait_state("led", {"Completed", "Failed"}, timeout_s=90)
        assert job["state"] == "Completed" and len(job["attempt_list"]) == 1

        first.kill9()  # the first to start leads; kill it
        killed_at = time.time()
        spec2 = write_spec(
            tmp_path / "job2.json", name="after-takeover", entrypoint=["python", "tests/e2e/contract_check.py"]
        )
        second.cli("submit", str(spec2), check=True)
        second.wait_state("after-takeover", {"InProgress", "Completed"}, timeout_s=30)
        assert time.time() - killed_at < 15, "the follower must take over within 15 s"
        assert second.wait_state("after-takeover", {"Completed", "Failed"}, timeout_s=90)["state"] == "Completed"
        # No job ran twice: one attempt each, and one Running event per attempt.
        for name in ("led", "after-takeover"):
            running = [
                e
                for e in second.events(name)
                if e["detail-type"] == "Aerie Attempt State Change" and e["detail"]["state"] == "Running"
            ]
            assert len(running) == 1
    finally:
        for plane in planes:
            plane.stop()
            plane.cleanup_nodes()
