"""`/metrics` scraped and parsed by prometheus_client's own parser: values read from the store at
scrape time, auth (API token, or the separate scrape token), tenant scoping, label sets that stay
bounded when 1,000 jobs exist (each with attempts, verdicts of known and unknown kinds and
checkpoints, inserted straight into the store), a scrape's queries that do not grow with them,
and the exposition kept a few seconds per tenant."""

from __future__ import annotations

import random
import time

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from orchestrator.server import build_app
from orchestrator.settings import Settings
from orchestrator.store.models import Attempt, Checkpoint, Job, Node, Verdict
from tests.helpers.tokens import auth_header as _h
from tests.helpers.tokens import make_token


def _scrape(client, token: str) -> dict[str, list]:
    r = client.get("/metrics", headers=_h(token))
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain")
    return {f.name: f.samples for f in text_string_to_metric_families(r.text)}


def _value(samples, name: str, **labels) -> float:
    [v] = [s.value for s in samples if s.name == name and all(s.labels.get(k) == x for k, x in labels.items())]
    return v


def _fill(app, jobs: int, tenant: str = "default", seed: int = 1) -> None:
    rng = random.Random(seed)
    now = time.time()
    kinds = ["silent.hang", "node.lost", "loss.nan", "exit.nonzero", "made.up.kind"]
    rows: list[list] = [[], [], []]  # jobs, attempts, their children: inserted in that order
    with app.state.db.session() as s:
        for i in range(jobs):
            jid = f"{tenant}-job-{i}"
            state = rng.choice(["Completed", "Failed", "InProgress"])
            rows[0].append(
                Job(
                    id=jid,
                    tenant=tenant,
                    name=f"j{i}",
                    spec={"resources": {"instance_count": 2}},
                    backend="local",
                    state=state,
                    created_at=now - 600,
                )
            )
            for n in (1, 2):
                aid = f"{jid}-a{n}"
                running = state == "InProgress" and n == 2
                rows[1].append(
                    Attempt(
                        id=aid,
                        job_id=jid,
                        number=n,
                        state="Running" if running else "Failed",
                        resume_from=f"s3://b/{jid}/step_00000010" if n == 2 else None,
                        reason=None if running else {"kind": rng.choice(kinds)},
                        created_at=now - 600 + n,
                        started_at=now - 590 + n,
                        ended_at=None if running else now - 300,
                    )
                )
                rows[2].append(
                    Node(
                        attempt_id=aid,
                        host=f"n{i}",
                        state="Running",
                        last_heartbeat_at=now - 1,
                        summary={"t": now - 1.2},
                    )
                )
                rows[2].append(Verdict(attempt_id=aid, host=f"n{i}", kind=rng.choice(kinds), t=now - 400))
            rows[2].append(
                Checkpoint(
                    job_id=jid,
                    attempt_id=f"{jid}-a1",
                    step=10,
                    uri=f"s3://b/{jid}/step_00000010",
                    size_bytes=1000,
                    meta={"save_s": 2.5},
                    state="good",
                )
            )
        for batch in rows:
            s.add_all(batch)
            s.flush()


def test_metrics_parse_and_hold_what_the_store_holds(api):
    client, app, admin = api
    _fill(app, 20)
    fams = _scrape(client, admin)
    with app.state.db.session() as s:
        assert (
            _value(fams["aerie_jobs"], "aerie_jobs", state="Completed")
            == s.query(Job).filter_by(state="Completed").count()
        )
        unknown = s.query(Verdict).filter_by(kind="made.up.kind").count()
    assert _value(fams["aerie_verdicts"], "aerie_verdicts_total", kind="other") == unknown
    restarts = fams["aerie_restarts"]
    assert _value(restarts, "aerie_restarts_total", mode="relaunch", resume="checkpoint") == 20
    assert _value(restarts, "aerie_restarts_total", mode="in_place", resume="scratch") == 0
    assert _value(fams["aerie_checkpoint_written_bytes"], "aerie_checkpoint_written_bytes_total") == 20_000
    assert _value(fams["aerie_checkpoint_save_seconds"], "aerie_checkpoint_save_seconds_count") == 20
    assert _value(fams["aerie_checkpoint_save_seconds"], "aerie_checkpoint_save_seconds_sum") == pytest.approx(50)
    lat = _value(fams["aerie_heartbeat_latency_seconds"], "aerie_heartbeat_latency_seconds_sum")
    count = _value(fams["aerie_heartbeat_latency_seconds"], "aerie_heartbeat_latency_seconds_count")
    assert count > 0 and lat / count == pytest.approx(0.2, abs=0.01)
    cats = {s.labels["category"] for s in fams["aerie_running_jobs_node_seconds"]}
    assert "productive" in cats and "restore" in cats


def test_label_sets_stay_bounded_with_1000_jobs(api):
    client, app, admin = api
    _fill(app, 10, seed=2)
    small = _scrape(client, admin)
    _fill(app, 1000, tenant="big", seed=3)
    app.state.metrics_cache.ttl_s = 0  # not the exposition kept from before the 1,000
    t = time.perf_counter()
    big = _scrape(client, admin)
    print(f"scrape of 1,010 jobs: {time.perf_counter() - t:.2f}s")
    assert sum(s.value for s in big["aerie_jobs"]) == 1010
    for name, samples in big.items():
        labels = {tuple(sorted(s.labels.items())) for s in samples}
        assert len(labels) <= max(len({tuple(sorted(s.labels.items())) for s in small.get(name, [])}), 1) + 6, name
        assert all(not any("job" in v for v in s.labels.values()) for s in samples), name
    assert sum(len(v) for v in big.values()) < 200


def test_auth_scrape_token_and_tenant_scope(aerie_home, monkeypatch):
    monkeypatch.setenv("AERIE_METRICS_TOKEN", "scrape-secret")
    settings = Settings()
    app = build_app(settings, with_controller=False)
    admin = settings.admin_token_path.read_text().strip()
    with TestClient(app) as client:
        _fill(app, 3, tenant="default")
        _fill(app, 5, tenant="other")
        assert client.get("/metrics").status_code == 401
        assert client.get("/metrics", headers=_h("wrong")).status_code == 401
        everyone = _scrape(client, "scrape-secret")
        assert sum(s.value for s in everyone["aerie_jobs"]) == 8
        viewer = make_token(client, admin, role="viewer", name="v", tenant="other")
        assert sum(s.value for s in _scrape(client, viewer)["aerie_jobs"]) == 5
        assert sum(s.value for s in _scrape(client, admin)["aerie_jobs"]) == 8
        # The scrape token opens nothing else.
        assert client.get("/v1/jobs", headers=_h("scrape-secret")).status_code == 401


def _statements(app, scrape) -> int:
    """How many SQL statements `scrape()` ran."""
    from sqlalchemy import event

    seen = []

    def count(*_args) -> None:
        seen.append(1)

    event.listen(app.state.db.engine, "before_cursor_execute", count)
    try:
        scrape()
    finally:
        event.remove(app.state.db.engine, "before_cursor_execute", count)
    return len(seen)


def test_a_scrape_of_1000_jobs_runs_the_queries_of_10(api):
    """Every family is counted in the database, and the running jobs' ledgers are read in a few
    queries for all of them: what a scrape costs in round trips does not grow with the fleet (but
    for one more query per 500 ids in an IN list: ~330 running jobs here have ~660 attempts)."""
    client, app, admin = api
    app.state.metrics_cache.ttl_s = 0
    _fill(app, 10, seed=4)
    _scrape(client, admin)  # the token's first lookup, warm from now on
    small = _statements(app, lambda: _scrape(client, admin))
    _fill(app, 1000, tenant="big", seed=5)
    big = _statements(app, lambda: _scrape(client, admin))
    assert small <= big <= small + 2, (small, big)
    assert small < 30, small


def test_the_exposition_is_kept_a_few_seconds_per_tenant(aerie_home, monkeypatch):
    from orchestrator.api.routes.metrics import SCRAPE_TTL_S

    settings = Settings()
    app = build_app(settings, with_controller=False)
    admin = settings.admin_token_path.read_text().strip()
    now = [1000.0]
    app.state.metrics_cache.clock = lambda: now[0]
    with TestClient(app) as client:
        viewer = make_token(client, admin, role="viewer", name="v", tenant="other")
        _fill(app, 3, tenant="default")
        assert sum(s.value for s in _scrape(client, admin)["aerie_jobs"]) == 3
        _fill(app, 5, tenant="other")
        # The fleet's view is kept: no query, the numbers of a moment ago.
        kept = _statements(app, lambda: _scrape(client, admin))
        assert sum(s.value for s in _scrape(client, admin)["aerie_jobs"]) == 3
        # Another tenant's is its own (not the fleet's kept one).
        assert sum(s.value for s in _scrape(client, viewer)["aerie_jobs"]) == 5
        now[0] += SCRAPE_TTL_S
        assert sum(s.value for s in _scrape(client, admin)["aerie_jobs"]) == 8
    assert kept <= 2, kept  # at most the token's check: nothing re-counted


def test_save_durations_and_the_fleet_are_counted_in_the_database(db):
    """On SQLite and PostgreSQL: only non-negative numbers are save durations (a string or a
    negative in a checkpoint's meta is skipped, not a failed scrape), and the fleet's node-seconds
    and failures come out as they did row by row."""
    from orchestrator.goodput import advice
    from orchestrator.goodput.prometheus import StoreCollector

    with db.session() as s:
        job = Job(
            id="j", tenant="t", name="j", spec={"resources": {"instance_count": 3}}, backend="local", state="Failed"
        )
        s.add(job)
        s.flush()
        for n, kind in enumerate(["exit.nonzero", "node.lost", "silent.hang", "user.error"], 1):
            s.add(
                Attempt(
                    id=f"j-a{n}",
                    job_id="j",
                    number=n,
                    state="Failed",
                    reason={"kind": kind},
                    started_at=10.0,
                    ended_at=110.0,
                )
            )
        s.add(Attempt(id="j-a5", job_id="j", number=5, state="Running", started_at=200.0))
        s.flush()
        for i, save in enumerate([0.3, 4.0, 700.0, "x", -1, None, True]):
            meta = {} if save is None else {"save_s": save}
            s.add(
                Checkpoint(
                    job_id="j",
                    attempt_id="j-a1",
                    step=i,
                    uri=f"s3://b/j/step_{i:08d}",
                    size_bytes=1,
                    meta=meta,
                    state="good",
                )
            )
        s.flush()
        seen = advice.fleet(s, now=300.0)
    assert seen.node_s == pytest.approx((4 * 100 + 100) * 3)
    assert (seen.failures, seen.not_reusable) == (3, 1)
    fams = {f.name: f.samples for f in StoreCollector(db).collect()}
    saves = fams["aerie_checkpoint_save_seconds"]
    assert _value(saves, "aerie_checkpoint_save_seconds_count") == 3
    assert _value(saves, "aerie_checkpoint_save_seconds_sum") == pytest.approx(704.3)
    assert _value(saves, "aerie_checkpoint_save_seconds_bucket", le="5") == 2
    assert _value(fams["aerie_checkpoints"], "aerie_checkpoints", state="good") == 7
