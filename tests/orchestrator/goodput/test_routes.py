"""The ledger where people see it, in-process: `GET /v1/jobs/{job}/goodput` (tenant-scoped), the
job page's goodput panel (server-rendered stacked bar), and `aerie goodput` / `aerie describe`."""

from __future__ import annotations

import re

import pytest
from fastapi.testclient import TestClient

from orchestrator.store import repo
from tests.helpers.tokens import auth_header as _h
from tests.helpers.tokens import make_token


def _job_with_history(app, tenant: str = "default", name: str = "gp") -> str:
    with app.state.db.session() as s:
        job = repo.create_job(s, {"name": name, "backend": "local", "resources": {"instance_count": 2}}, tenant)
        a = repo.create_attempt(s, job, 1)
        repo.set_attempt_state(s, a, "Running")
        t0 = job.created_at
        a.started_at = t0 + 1
        repo.record_metrics(s, a, [{"step": i, "t": t0 + 3 + i * 0.5} for i in range(1, 21)])
        repo.record_checkpoint(s, a, 10, "s3://b/c/j/step_00000010/attempt_0001", {"save_s": 1.0})
        repo.set_attempt_state(s, a, "Completed")
        a.ended_at = t0 + 14
        repo.set_job_state(s, job, "Completed")
        job.ended_at = t0 + 15
        return job.id


def test_the_api_returns_the_ledger_to_its_tenant_only(api):
    client, app, admin = api
    job_id = _job_with_history(app)
    r = client.get(f"/v1/jobs/{job_id}/goodput", headers=_h(admin))
    assert r.status_code == 200, r.text
    led = r.json()
    assert led["nodes"] == 2 and led["node_seconds"] == pytest.approx(30)
    assert sum(led["categories"].values()) == pytest.approx(30)
    assert led["categories"]["productive"] == pytest.approx(20)
    assert r.json() == client.get("/v1/jobs/gp/goodput", headers=_h(admin)).json() | {"end": led["end"]}
    other = make_token(client, admin, role="viewer", name="o", tenant="other")
    assert client.get(f"/v1/jobs/{job_id}/goodput", headers=_h(other)).status_code == 404
    assert client.get("/v1/jobs/nope/goodput", headers=_h(admin)).status_code == 404
    assert client.get(f"/v1/jobs/{job_id}/goodput").status_code == 401


def test_the_job_page_draws_the_ledger_as_a_stacked_bar(api):
    _client, app, admin = api
    job_id = _job_with_history(app)
    browser = TestClient(app)
    assert (
        browser.post("/ui/login", data={"token": admin, "next": "/ui/jobs"}, follow_redirects=False).status_code == 303
    )
    html = browser.get(f"/ui/jobs/{job_id}").text
    assert 'id="goodput-bar"' in html and 'id="goodput-legend"' in html
    rect = r'<rect class="g g-\w+" data-category="\w+" x="[\d.]+" y="0" width="([\d.]+)"'
    widths = [float(w) for w in re.findall(rect, html)]
    assert "style=" not in html.split('id="goodput"')[1].split("</section>")[0]  # the CSP forbids inline styles
    assert widths and sum(widths) == pytest.approx(100, abs=0.5)
    assert re.search(r'data-goodput="0\.6667"', html)
    assert 'id="goodput"' in browser.get(f"/ui/jobs/{job_id}?partial=1").text


def test_the_cli_prints_a_table_and_a_summary(api, monkeypatch, capsys):
    client, app, admin = api
    job_id = _job_with_history(app)
    from typer.testing import CliRunner

    from orchestrator import cli
    from orchestrator.cli import api as cli_api
    from orchestrator.client import Client

    class InProcess(Client):
        def request(self, method, path, **kwargs):
            r = client.request(method, path, headers=_h(admin), **kwargs)
            assert r.status_code == 200, r.text
            return r.json()

    # Every command builds its client with `Client()` in orchestrator/cli/api.py: swap it there.
    monkeypatch.setattr(cli_api, "Client", lambda: InProcess(api="http://in-process", token=admin))
    out = CliRunner().invoke(cli.app, ["goodput", job_id], env={"COLUMNS": "200"})
    assert out.exit_code == 0, out.output
    assert "productive steps" in out.output and "checkpoint stall" in out.output
    assert re.search(r"goodput 66\.7% of 30\.0s node-time \(2 nodes × 15\.0s\)", out.output), out.output
    assert "Young–Daly" in out.output and "S3 tier (checkpoint.every_steps)" in out.output
    described = CliRunner().invoke(cli.app, ["describe", job_id], env={"COLUMNS": "200"})
    assert described.exit_code == 0 and "goodput 66.7%" in described.output and "advice" in described.output
