"""`POST/GET /v1/attempts/{id}/nodes/{host}/preflight`: a node's pre-flight result is stored,
emitted and (failed) recorded as its verdict; the attempt's decision waits for every node, starts
when all passed and aborts when one failed (the in-process app on a real SQLite store)."""

from __future__ import annotations

from aerie_contracts import DetailType, FailureKind
from aerie_contracts.preflight import Decision
from orchestrator.store import repo
from orchestrator.store.models import Event, Node
from tests.helpers.tokens import agent_attempt, auth_header


def _running_attempt(app) -> tuple[str, str]:
    _job_id, attempt_id, token = agent_attempt(app, "pf")
    return attempt_id, token


def _result(host: str, passed: bool) -> dict:
    check = {"check": "compute", "passed": passed, "value": 40.0 if passed else 0.05, "threshold": 0.5}
    check["reason"] = "one CPU core 40 GFLOP/s" if passed else "one CPU core 0.05 GFLOP/s < 0.5"
    return {"host": host, "passed": passed, "checks": [check], "elapsed_s": 2.5, "budget_s": 60.0, "t": 1.0}


def test_the_decision_waits_for_every_node_then_starts(api):
    client, app, _admin = api
    a1, token = _running_attempt(app)
    url = f"/v1/attempts/{a1}/nodes/{{}}/preflight"
    first = client.post(url.format("algo-1"), json=_result("algo-1", True), headers=auth_header(token))
    assert first.status_code == 200 and first.json()["action"] == Decision.WAIT
    assert "algo-2" in first.json()["why"]
    assert client.get(url.format("algo-1"), headers=auth_header(token)).json()["action"] == Decision.WAIT
    second = client.post(url.format("algo-2"), json=_result("algo-2", True), headers=auth_header(token))
    assert second.json()["action"] == Decision.START
    assert client.get(url.format("algo-1"), headers=auth_header(token)).json()["action"] == Decision.START
    with app.state.db.session() as s:
        rows = {n.host: n.preflight for n in s.query(Node).filter(Node.attempt_id == a1)}
        events = [e.detail for e in s.query(Event).filter(Event.detail_type == DetailType.PREFLIGHT_CHECKED)]
    assert rows["algo-1"]["passed"] and rows["algo-2"]["checks"][0]["value"] == 40.0
    assert sorted(e["host"] for e in events) == ["algo-1", "algo-2"] and all(e["passed"] for e in events)


def test_a_failed_node_aborts_the_attempt_and_is_its_own_verdict(api):
    client, app, _admin = api
    a1, token = _running_attempt(app)
    url = f"/v1/attempts/{a1}/nodes/{{}}/preflight"
    client.post(url.format("algo-1"), json=_result("algo-1", True), headers=auth_header(token))
    answer = client.post(url.format("algo-2"), json=_result("algo-2", False), headers=auth_header(token)).json()
    assert answer["action"] == Decision.ABORT and answer["failed"] == ["algo-2"]
    assert client.get(url.format("algo-1"), headers=auth_header(token)).json()["action"] == Decision.ABORT
    with app.state.db.session() as s:
        verdicts = repo.verdicts_of(s, [a1])
        event = s.query(Event).filter(Event.detail_type == DetailType.PREFLIGHT_CHECKED).all()
    assert [(v.host, v.kind) for v in verdicts] == [("algo-2", FailureKind.PREFLIGHT_FAILED)]
    assert "0.05 GFLOP/s < 0.5" in verdicts[0].message
    failed = [e.detail for e in event if not e.detail["passed"]]
    assert failed and failed[0]["failed"] == ["compute"] and "FAILED" in failed[0]["summary"]
    # A repeated report (the agent's retry) is stored, not emitted twice.
    client.post(url.format("algo-2"), json=_result("algo-2", False), headers=auth_header(token))
    with app.state.db.session() as s:
        assert len(repo.verdicts_of(s, [a1])) == 1


def test_an_ended_attempt_aborts_and_a_malformed_result_is_refused(api):
    client, app, _admin = api
    a1, token = _running_attempt(app)
    url = f"/v1/attempts/{a1}/nodes/algo-1/preflight"
    assert client.post(url, json={"checks": []}, headers=auth_header(token)).status_code == 422
    with app.state.db.session() as s:
        repo.set_attempt_state(s, repo.get_attempt(s, a1), "Failed", {"kind": "node.lost"})
    answer = client.get(f"/v1/attempts/{a1}/nodes/algo-1/preflight", headers=auth_header(token)).json()
    assert answer["action"] == Decision.ABORT


def test_the_reporter_asks_for_the_decision_and_an_older_control_plane_cannot_hold_the_node(api):
    """The agent's reporter against the real app: the decision route, and a route that is not there."""
    import aerie_client
    from agent.report import Reporter

    client, app, _admin = api
    with app.state.db.session() as s:
        job = repo.create_job(s, {"name": "pf", "backend": "local", "entrypoint": ["x"]}, "default")
        attempt = repo.create_attempt(s, job, 1)
        attempt.handle = {"root": "/nowhere", "hosts": ["algo-1"]}
        repo.set_attempt_state(s, attempt, "Running")
        a1, token = attempt.id, repo.mint_token(s, "agent", attempt_id=attempt.id)
    rep = Reporter("http://testserver", token, a1, "algo-1")
    rep._client = aerie_client.Client("http://testserver", token, http=client)  # the in-process app
    assert rep.preflight_decision()["action"] == Decision.WAIT
    answer = rep.preflight({"passed": True, "checks": [], "elapsed_s": 1.0})
    assert answer["action"] == Decision.START and rep.preflight_decision()["action"] == Decision.START
    rep.base = "/v1/no-such-route"  # a control plane older than pre-flight
    assert rep.preflight_decision()["action"] == Decision.START


def test_a_hot_spare_s_own_result_is_shown_with_the_attempt_but_is_no_node_of_it(api):
    """A spare checks itself alone while it waits: its result is kept for the API (the attempt's
    `spare_preflight`) and emitted, but it makes no node row, no verdict and no part of the decision."""
    from orchestrator.api.read_model import attempt_out

    client, app, _admin = api
    a1, token = _running_attempt(app)
    url = f"/v1/attempts/{a1}/nodes/{{}}/preflight"
    bad = {**_result("algo-3", False), "spare": True}
    answer = client.post(url.format("algo-3"), json=bad, headers=auth_header(token)).json()
    assert answer["action"] == Decision.WAIT and "hot spare" in answer["why"]
    client.post(url.format("algo-1"), json=_result("algo-1", True), headers=auth_header(token))
    answer = client.post(url.format("algo-2"), json=_result("algo-2", True), headers=auth_header(token)).json()
    assert answer["action"] == Decision.START  # the spare's failure is not the attempt's
    with app.state.db.session() as s:
        attempt = repo.get_attempt(s, a1)
        out = attempt_out(attempt)
        assert repo.verdicts_of(s, [a1]) == []
        events = [e.detail for e in s.query(Event).filter(Event.detail_type == DetailType.PREFLIGHT_CHECKED)]
    assert sorted(n.host for n in out.nodes) == ["algo-1", "algo-2"]
    assert out.spare_preflight["algo-3"]["spare"] is True and not out.spare_preflight["algo-3"]["passed"]
    (spare,) = [e for e in events if e.get("spare")]
    assert spare["host"] == "algo-3" and not spare["passed"] and spare["failed"] == ["compute"]
