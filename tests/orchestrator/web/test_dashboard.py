"""The dashboard (orchestrator/web) in-process: sign-in, redirects, tenant isolation, the metrics
series from agents to curves, and the payload of a big job staying small."""

from __future__ import annotations

import json
import re
import time

import pytest
from fastapi.testclient import TestClient

from orchestrator.store import repo
from orchestrator.store.models import MetricPoint
from orchestrator.web.auth import COOKIE
from orchestrator.web.downsample import minmax
from orchestrator.web.health import NodeHistory
from tests.helpers.tokens import auth_header as _h
from tests.helpers.tokens import make_token as _token


def _browser(app, token: str | None) -> TestClient:
    """A separate cookie jar (one browser), signed in with `token` when given."""
    c = TestClient(app)
    if token:
        r = c.post("/ui/login", data={"token": token, "next": "/ui/jobs"}, follow_redirects=False)
        assert r.status_code == 303, r.text
    return c


def _job(app, tenant: str, name: str) -> tuple[str, str]:
    with app.state.db.session() as s:
        job = repo.create_job(s, {"name": name, "backend": "local", "entrypoint": ["x"]}, tenant)
        attempt = repo.create_attempt(s, job, 1)
        return job.id, attempt.id


def _ui_urls(app, job_id: str) -> list[str]:
    """Every GET route of the dashboard, from its router (so a new page can't be forgotten)."""
    from orchestrator.web.routes import router

    urls = []
    for route in router.routes:
        path = getattr(route, "path", "")
        if path.startswith("/ui/") and "GET" in getattr(route, "methods", set()) and path != "/ui/login":
            urls.append(path.replace("{job_ref}", job_id))
    return urls


def test_pages_redirect_to_login_without_a_valid_session(api):
    client, app, admin = api
    job_id, _ = _job(app, "default", "j")
    urls = _ui_urls(app, job_id) + [f"/ui/jobs/{job_id}?partial=1"]
    assert len(urls) >= 5
    anonymous = TestClient(app)
    forged = TestClient(app, cookies={COOKIE: "not-a-session"})
    for c in (anonymous, forged):
        for url in urls:
            r = c.get(url, follow_redirects=False)
            assert r.status_code == 303 and r.headers["location"].startswith("/ui/login?next=/ui/"), (
                url,
                r.status_code,
            )
    assert client.get("/", follow_redirects=False).headers["location"] == "/ui/jobs"

    # A session ends with sign-out, and with its token's revocation.
    member = client.post("/v1/tokens", json={"role": "viewer"}, headers=_h(admin)).json()
    browser = _browser(app, member["token"])
    assert browser.get("/ui/jobs", follow_redirects=False).status_code == 200
    assert client.delete(f"/v1/tokens/{member['id']}", headers=_h(admin)).status_code == 200
    assert browser.get("/ui/jobs", follow_redirects=False).status_code == 303
    browser = _browser(app, admin)
    assert browser.post("/ui/logout", follow_redirects=False).status_code == 303
    assert browser.get("/ui/jobs", follow_redirects=False).status_code == 303


def test_login_sets_a_strict_httponly_session_and_never_echoes_the_token(api):
    _client, app, admin = api
    r = TestClient(app).post("/ui/login", data={"token": "aer_adm_wrong"}, follow_redirects=False)
    assert r.status_code == 401 and "not valid" in r.text and COOKIE not in r.headers.get("set-cookie", "")
    _, attempt_id = _job(app, "default", "j")
    with app.state.db.session() as s:
        agent = repo.mint_token(s, "agent", attempt_id=attempt_id)
    assert TestClient(app).post("/ui/login", data={"token": agent}, follow_redirects=False).status_code == 401

    c = TestClient(app)
    r = c.post("/ui/login", data={"token": admin, "next": "https://evil.example/"}, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/ui/jobs"  # never an open redirect
    cookie = r.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/" in cookie
    assert admin not in cookie
    page = c.get("/ui/jobs")
    assert page.status_code == 200 and admin not in page.text
    assert "default-src 'self'" in page.headers["content-security-policy"]


def test_one_tenants_jobs_never_appear_on_anothers_pages(api):
    client, app, admin = api
    a = _token(client, admin, role="viewer", tenant="team-a")
    b = _token(client, admin, role="admin", tenant="team-b")
    job_a, attempt_a = _job(app, "team-a", "secret-a")
    job_b, _ = _job(app, "team-b", "visible-b")
    with app.state.db.session() as s:
        repo.record_metrics(s, repo.get_attempt(s, attempt_a), [{"step": 1, "loss": 3.0, "t": 1.0}])
        repo.record_checkpoint(s, repo.get_attempt(s, attempt_a), 1, "s3://b/secret-a/step_00000001", {})
    browser_a, browser_b = _browser(app, a), _browser(app, b)

    listing = browser_b.get("/ui/jobs").text
    assert "visible-b" in listing and "secret-a" not in listing and job_a not in listing
    for url in _ui_urls(app, job_a) + [f"/ui/jobs/{job_a}?partial=1", "/ui/jobs/secret-a"]:
        if url.startswith("/ui/jobs/"):
            r = browser_b.get(url, follow_redirects=False)
            assert r.status_code == 404, (url, r.status_code)
            assert "secret-a/step" not in r.text and "3.0" not in r.text
            assert browser_a.get(url, follow_redirects=False).status_code == 200, url
    # The owner's view, filtered: their job only, the other tenant's never.
    mine = browser_a.get("/ui/jobs?q=secret").text
    assert job_a in mine and job_b not in mine
    assert job_b not in browser_a.get("/ui/jobs?q=visible").text


def test_agent_metrics_become_the_chain_curve(api):
    client, app, admin = api
    job_id, a1 = _job(app, "default", "chain")
    with app.state.db.session() as s:
        job = repo.get_job(s, "default", job_id)
        a2 = repo.create_attempt(s, job, 2, resume_from=f"s3://b/{job_id}/step_00000050").id
        t1, t2 = repo.mint_token(s, "agent", attempt_id=a1), repo.mint_token(s, "agent", attempt_id=a2)
    first = [{"t": 100.0 + i, "step": i, "loss": 10.0 - i * 0.01, "tokens_per_s": 1000.0} for i in range(1, 81)]
    first[40]["loss"] = float("nan")  # what the agent never sends, but a hand-rolled client might
    url = f"/v1/attempts/{a1}/nodes/algo-1/metrics"
    r = client.post(url, content=json.dumps({"records": first}), headers={**_h(t1), "content-type": "application/json"})
    assert r.status_code == 200 and r.json()["new"] == 80
    assert client.post(url, json={"records": first[:10]}, headers=_h(t1)).json()["new"] == 0  # re-sent: ignored
    assert client.post(url, json={"records": first[:1]}, headers=_h(t2)).status_code == 403  # another attempt's token
    second = [{"t": 300.0 + i, "step": i, "loss": 5.0} for i in range(51, 71)]
    assert (
        client.post(f"/v1/attempts/{a2}/nodes/algo-1/metrics", json={"records": second}, headers=_h(t2)).status_code
        == 200
    )
    with app.state.db.session() as s:
        repo.record_verdict(s, repo.get_attempt(s, a1), "algo-1", "silent.hang", "rank 1 stuck", {})
        s.flush()
        from orchestrator.store.models import Verdict

        s.query(Verdict).update({"t": 160.5})

    data = _browser(app, admin).get(f"/ui/jobs/{job_id}/series.json").json()
    loss = data["series"]["loss"]
    # Attempt 1's steps 51..80 were redone by attempt 2 (resumed from 50): the chain is 1..50 then 51..70.
    assert loss["x"] == [i for i in range(1, 71) if i != 41]
    assert loss["y"][-1] == 5.0 and loss["y"][0] == pytest.approx(9.99)
    assert data["resumes"] == [{"attempt": 2, "step": 50}]
    assert data["points"] == 70
    assert data["verdicts"][0]["kind"] == "silent.hang" and data["verdicts"][0]["step"] == 60


def test_100_jobs_and_a_100k_point_curve_stay_small_and_fast(api):
    _client, app, admin = api
    with app.state.db.session() as s:
        for i in range(100):
            job = repo.create_job(s, {"name": f"job-{i:03d}", "backend": "local", "entrypoint": ["x"]}, "default")
            attempt = repo.create_attempt(s, job, 1)
        big_id = job.id
        rows = [
            dict(
                job_id=job.id,
                attempt_id=attempt.id,
                attempt_number=1,
                step=i,
                t=1e9 + i,
                loss=4.0 + (i % 97) / 97,
                grad_norm=1.0 + (i % 13) / 13,
                lr=3e-4 * (1 - i / 1e5),
                tokens_per_s=5e4 + (i % 31) * 100,
                mfu=0.4 + (i % 7) / 100,
                tokens_per_dollar=1e7 + i,
            )
            for i in range(1, 100_001)
        ]
        rows[54_320]["loss"] = 99.0  # one spike, one step wide
        s.execute(MetricPoint.__table__.insert(), rows)
    browser = _browser(app, admin)

    started = time.perf_counter()
    r = browser.get(f"/ui/jobs/{big_id}/series.json")
    first_s = time.perf_counter() - started
    assert r.status_code == 200
    assert len(r.content) < 1_000_000, len(r.content)
    data = r.json()
    assert data["points"] == 100_000
    assert set(data["series"]) == set(repo.METRIC_SERIES)
    assert all(len(s["x"]) <= 2000 for s in data["series"].values())
    assert max(data["series"]["loss"]["y"]) == 99.0  # min/max buckets keep the spike
    started = time.perf_counter()
    assert browser.get(f"/ui/jobs/{big_id}/series.json").status_code == 200
    cached_s = time.perf_counter() - started

    started = time.perf_counter()
    page = browser.get("/ui/jobs")
    list_s = time.perf_counter() - started
    assert page.status_code == 200 and len(page.content) < 1_000_000
    assert len(re.findall(r"<tr data-job=", page.text)) == 100
    job_page = browser.get(f"/ui/jobs/{big_id}")
    assert job_page.status_code == 200 and len(job_page.content) < 1_000_000
    print(f"series {len(r.content)} B in {first_s:.2f}s (cached {cached_s:.3f}s); jobs list {list_s:.2f}s")
    # Generous bounds (shared CI cores); the cached answer is what a polling page gets.
    assert first_s < 5 and cached_s < 1 and list_s < 3


def test_minmax_downsampling_keeps_extremes_and_order():
    xs = list(range(10_000))
    ys = [float(x % 100) for x in xs]
    ys[1234], ys[8765] = 1e6, -1e6
    x, y = minmax(xs, ys, 500)
    assert len(x) <= 500 and x == sorted(x)
    assert max(y) == 1e6 and min(y) == -1e6
    assert minmax([1, 2, 3], [1.0, None, 3.0], 10) == ([1, 3], [1.0, 3.0])


def test_node_history_is_bounded_and_sampled_from_heartbeats(api, monkeypatch):
    client, app, _admin = api
    history = NodeHistory(every_s=10.0, points=3, max_nodes=2)
    clock = [1000.0]
    monkeypatch.setattr("orchestrator.web.health.time.time", lambda: clock[0])
    beat = {
        "accelerators": [{"util": 50.0, "mem_used": 100}, {"util": 100.0, "mem_used": 50}],
        "nics": [{"name": "eth0", "rx_bps": 10.0, "tx_bps": 20.0}],
    }
    for _i in range(40):  # one heartbeat a second for 40 s: 4 points due, 3 kept
        clock[0] += 1.0
        history.add("a1", "algo-1", beat)
    history.add("a1", "algo-2", {"accelerators": 5, "nics": "x"})  # malformed: no point, no error
    points = history.series(["a1"])["algo-1"]
    assert len(points) == 3 and points[-1][1:5] == (75.0, 150.0, 10.0, 20.0)
    history.add("a2", "algo-1", beat)
    history.add("a3", "algo-1", beat)
    assert len(history._nodes) == 2  # the oldest node is forgotten

    # The heartbeat route feeds the app's history.
    _, attempt_id = _job(app, "default", "hb")
    with app.state.db.session() as s:
        token = repo.mint_token(s, "agent", attempt_id=attempt_id)
    app.state.node_history.every_s = 0.0
    assert (
        client.post(f"/v1/attempts/{attempt_id}/nodes/algo-1/heartbeat", json=beat, headers=_h(token)).status_code
        == 200
    )
    assert app.state.node_history.series([attempt_id])["algo-1"]


def test_the_job_page_shows_every_node_s_preflight_result_and_why_one_failed(api):
    _client, app, admin = api
    job_id, a1 = _job(app, "default", "preflighted")
    ok = {"check": "compute", "passed": True, "value": 41.5, "threshold": 0.5, "unit": "GFLOP/s", "reason": "fine"}
    bad = {"check": "shm", "passed": False, "value": 0, "threshold": 256, "unit": "MiB", "reason": "free 0 MiB < 256"}
    with app.state.db.session() as s:
        attempt = repo.get_attempt(s, a1)
        repo.record_preflight(s, attempt, "algo-1", {"passed": True, "checks": [ok], "elapsed_s": 3.2})
        repo.record_preflight(s, attempt, "algo-2", {"passed": False, "checks": [ok, bad], "elapsed_s": 2.9})
    page = _browser(app, admin).get(f"/ui/jobs/{job_id}").text
    section = page[page.index('id="preflight"') :]
    section = section[: section.index("</table>")]
    assert "algo-1" in section and "algo-2" in section and "FAILED" in section and "3.2 s" in section
    assert "compute 41.5 / 0.5 GFLOP/s" in section and "shm 0 / 256 MiB ✗" in section
    assert "shm: free 0 MiB &lt; 256" in section  # the reason, escaped
    assert "pre-flight on algo-2 (attempt 1): FAILED" in page  # the event timeline


def test_the_job_page_shows_the_stacks_at_stop_time_and_the_root_cause(api):
    """A hang's `ranks` evidence (agent/diagnose.py) on the job page, as `aerie describe` prints it."""
    _client, app, admin = api
    job_id, a1 = _job(app, "default", "hung")
    wait = '  File "/v/torch/distributed/distributed_c10d.py", line 2800 in all_reduce\n'
    user = '  File "/job/train.py", line 40 in main\n'
    loader = '  File "/job/data/loader.py", line 88 in __next__\n'
    head = "Current thread 0x2 (most recent call first):\n"

    def rank(stack: str, **kw) -> dict:
        return {"answered": True, "process_state": "sleeping", "stack": head + stack, "collectives": 12, **kw}

    with app.state.db.session() as s:
        attempt = repo.get_attempt(s, a1)
        waiting = {"ranks": {"0": rank(wait + user, in_collective="all_reduce")}}
        repo.record_verdict(s, attempt, "algo-1", "silent.hang", "no step for 31s", waiting)
        stuck = {"ranks": {"1": rank(loader + user)}}
        repo.record_verdict(s, attempt, "algo-2", "silent.hang", "no step for 30s", stuck)
    page = _browser(app, admin).get(f"/ui/jobs/{job_id}").text
    section = page[page.index('id="stacks"') :]
    section = section[: section.index("</pre>")]
    assert "root cause: rank 1 on algo-2 in data/loader.py:88" in section, section
    assert "algo-1 rank 0: waiting in all_reduce, 12 collectives" in section
    assert "algo-2 rank 1: not waiting, 12 collectives; at data/loader.py:88 __next__()  &lt;- root cause" in section
    assert "/job/data/loader.py:88 __next__()" in section
    quiet_id, _ = _job(app, "default", "quiet")
    assert 'id="stacks"' not in _browser(app, admin).get(f"/ui/jobs/{quiet_id}").text  # no hang, no panel
