"""`/metrics` scraped and parsed by prometheus_client's own parser: values read from the store at
scrape time, auth (API token, or the separate scrape token), tenant scoping, and label sets that
stay bounded when 1,000 jobs exist (each with attempts, verdicts of known and unknown kinds and
checkpoints, inserted straight into the store)."""

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
    assert _value(fams["aerie_restarts"], "aerie_restarts_total", mode="checkpoint") == 20
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
    t = time.perf_counter()
    big = _scrape(client, admin)
    print(f"scrape of 1,010 jobs: {time.perf_counter() - t:.2f}s")
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
