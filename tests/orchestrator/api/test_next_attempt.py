"""`GET /v1/attempts/{id}/nodes/{host}/next`: what an agent kept up after its worker group ended
does next, and the fencing of the hand-over (the in-process app on a real SQLite store)."""

from __future__ import annotations

from aerie_contracts import memckpt
from aerie_contracts.restarts import CAUSE_MODE
from orchestrator.store import repo
from tests.helpers.tokens import agent_attempt, auth_header


def _failed_attempt(app) -> tuple[str, str, str]:
    return agent_attempt(app, "warm", {"kind": "exit.nonzero"})


def _successor(app, job_id: str, mode: str) -> str:
    with app.state.db.session() as s:
        job = repo.get_job(s, "default", job_id)
        attempt = repo.create_attempt(s, job, 2, resume_from="s3://b/ckpt/step_10")
        attempt.cause = {CAUSE_MODE: mode}
        return attempt.id


def test_an_agent_waits_then_gets_its_in_place_successor_with_a_token_for_it_alone(api):
    client, app, _admin = api
    job_id, a1, token = _failed_attempt(app)
    ask = lambda host="algo-1", tok=token: client.get(f"/v1/attempts/{a1}/nodes/{host}/next", headers=auth_header(tok))  # noqa: E731
    assert ask().json()["action"] == "wait"  # no decision yet
    assert ask().json()["attempt_over"] is True  # (a stalled node's question: it stops its ranks)
    with app.state.db.session() as s:
        repo.get_attempt(s, a1).state = "Running"
    assert ask().json() == {**ask().json(), "action": "wait", "attempt_over": False}  # still running
    with app.state.db.session() as s:
        repo.get_attempt(s, a1).state = "Failed"
    a2 = _successor(app, job_id, "in_place")
    assert ask().json()["action"] == "wait"  # decided, not launched yet
    with app.state.db.session() as s:
        attempt = repo.get_attempt(s, a2)
        attempt.handle = {
            "root": "/nowhere",
            "hosts": ["algo-1", "algo-2"],
            "attempt_id": a2,
            "master_port": 4242,
            memckpt.HANDLE_KEY: "ab" * 32,
        }
        repo.set_attempt_state(s, attempt, "Running")
    answer = ask().json()
    assert answer["action"] == "restart" and answer["attempt_id"] == a2 and answer["attempt_number"] == 2
    assert answer["resume_from"] == "s3://b/ckpt/step_10" and answer["master_port"] == 4242
    assert answer["memckpt_key"] == "ab" * 32  # the memory tier's replication key of attempt 2
    assert answer["master_addr"] is None  # rank 0's node unchanged: the agents keep their address
    # ...which no reader of the job sees (the API never shows a handle).
    shown = client.get(f"/v1/jobs/{job_id}", headers=auth_header(_admin))
    assert shown.status_code == 200 and a2 in shown.text and "ab" * 32 not in shown.text
    new = answer["token"]
    # Fencing: the new token speaks for attempt 2 only, the old one for attempt 1 only.
    assert (
        client.post(f"/v1/attempts/{a2}/nodes/algo-1/heartbeat", json={"t": 1}, headers=auth_header(new)).status_code
        == 200
    )
    assert (
        client.post(f"/v1/attempts/{a1}/nodes/algo-1/heartbeat", json={"t": 1}, headers=auth_header(new)).status_code
        == 403
    )
    assert (
        client.post(
            f"/v1/attempts/{a2}/nodes/algo-1/exit", json={"exit_code": 1}, headers=auth_header(token)
        ).status_code
        == 403
    )
    # A host the successor does not run on gets nothing; neither does a token of another attempt.
    assert ask("algo-9").json()["action"] == "exit"
    assert ask(tok=new).status_code == 403


def test_a_relaunch_or_the_job_s_end_sends_the_agent_home(api):
    client, app, _admin = api
    job_id, a1, token = _failed_attempt(app)
    _successor(app, job_id, "relaunch")
    answer = client.get(f"/v1/attempts/{a1}/nodes/algo-1/next", headers=auth_header(token)).json()
    assert answer["action"] == "exit" and "in-place successor" in answer["why"]
    job_id, a1, token = _failed_attempt(app)
    with app.state.db.session() as s:
        repo.set_job_state(s, repo.get_job(s, "default", job_id), "Failed", {"kind": "exit.nonzero"})
    assert client.get(f"/v1/attempts/{a1}/nodes/algo-1/next", headers=auth_header(token)).json()["action"] == "exit"


def test_a_hot_spare_waits_through_attempts_until_one_gives_it_a_slot_with_the_new_host_list(api):
    client, app, _admin = api
    with app.state.db.session() as s:
        job = repo.create_job(s, {"name": "spare", "backend": "local", "entrypoint": ["x"]}, "default")
        repo.set_job_state(s, job, "InProgress")
        attempt = repo.create_attempt(s, job, 1)
        attempt.handle = {"root": "/nowhere", "hosts": ["algo-1", "algo-2"], "spares": ["algo-3", "algo-4"]}
        repo.set_attempt_state(s, attempt, "Running")
        job_id, a1, token = job.id, attempt.id, repo.mint_token(s, "agent", attempt_id=attempt.id)
    ask = lambda host="algo-3": client.get(f"/v1/attempts/{a1}/nodes/{host}/next", headers=auth_header(token)).json()  # noqa: E731
    assert ask()["action"] == "wait" and "hot spare" in ask()["why"]  # attempt 1 runs
    with app.state.db.session() as s:
        repo.set_attempt_state(s, repo.get_attempt(s, a1), "Failed", {"kind": "node.lost", "host": "algo-1"})
    a2 = _successor(app, job_id, "in_place")
    assert ask()["action"] == "wait"  # decided, not launched
    with app.state.db.session() as s:
        attempt = repo.get_attempt(s, a2)
        # algo-3 took algo-1's slot, node rank 0: the backend records its address.
        attempt.handle = {
            "root": "/nowhere",
            "hosts": ["algo-3", "algo-2"],
            "spares": ["algo-4"],
            "attempt_id": a2,
            "master_addr": "10.0.0.3",
        }
        repo.set_attempt_state(s, attempt, "Running")
    answer = ask()
    assert answer["action"] == "restart" and answer["attempt_id"] == a2 and answer["hosts"] == ["algo-3", "algo-2"]
    assert answer["master_addr"] == "10.0.0.3"  # the new attempt's rendezvous host
    assert ask("algo-4")["action"] == "wait"  # still a spare
    # The survivor learns the new host list and rank 0's address too.
    survivor = client.get(f"/v1/attempts/{a1}/nodes/algo-2/next", headers=auth_header(token)).json()
    assert survivor["action"] == "restart" and survivor["hosts"] == ["algo-3", "algo-2"]
    assert survivor["master_addr"] == "10.0.0.3"
    # A relaunch (spares of its own) sends the remaining spare home.
    with app.state.db.session() as s:
        repo.set_attempt_state(s, repo.get_attempt(s, a2), "Failed", {"kind": "exit.nonzero"})
        relaunch = repo.create_attempt(s, repo.get_job(s, "default", job_id), 3)
        relaunch.cause = {CAUSE_MODE: "relaunch"}
        relaunch.handle = {"root": "/elsewhere", "hosts": ["algo-1", "algo-3"], "spares": ["algo-5"]}
        repo.set_attempt_state(s, relaunch, "Running")
    assert ask("algo-4")["action"] == "exit"


def test_a_replenished_spare_learned_only_by_the_next_attempt_still_waits_and_takes_a_slot(api):
    """A Slurm spare allocation submitted by attempt 2 whose node recorded itself after attempt 2's
    last poll: attempt 3's handle names it (`spare_allocations`, with attempt 2's id); its agent,
    with attempt 2's token, is a spare of the chain, not a node attempt 3 left out."""
    client, app, _admin = api
    with app.state.db.session() as s:
        job = repo.create_job(s, {"name": "refill", "backend": "slurm", "entrypoint": ["x"]}, "default")
        repo.set_job_state(s, job, "InProgress")
        a2 = repo.create_attempt(s, job, 2)
        a2.cause = {CAUSE_MODE: "in_place"}
        a2.handle = {"root": "/r", "hosts": ["node2"], "spares": [], "spare_allocations": [{"attempt_id": a2.id}]}
        repo.set_attempt_state(s, a2, "Failed", {"kind": "exit.nonzero"})
        job_id, a2_id, token = job.id, a2.id, repo.mint_token(s, "agent", attempt_id=a2.id)
    ask = lambda host="node3": client.get(f"/v1/attempts/{a2_id}/nodes/{host}/next", headers=auth_header(token)).json()  # noqa: E731
    allocation = {"attempt_id": a2_id, "hosts": ["node3"]}
    with app.state.db.session() as s:
        a3 = repo.create_attempt(s, repo.get_job(s, "default", job_id), 3)
        a3.cause = {CAUSE_MODE: "in_place"}
        a3.handle = {"root": "/r", "hosts": ["node2"], "spares": ["node3"], "spare_allocations": [allocation]}
        repo.set_attempt_state(s, a3, "Running")
    assert ask()["action"] == "wait"  # still a spare of attempt 3
    assert ask("node4")["action"] == "exit"  # a host no spare allocation of attempt 2 holds
    with app.state.db.session() as s:
        repo.set_attempt_state(s, repo.get_attempt(s, a3.id), "Failed", {"kind": "exit.nonzero"})
        a4 = repo.create_attempt(s, repo.get_job(s, "default", job_id), 4)
        a4.cause = {CAUSE_MODE: "in_place"}
        a4.handle = {"root": "/r", "hosts": ["node3"], "spares": [], "spare_allocations": [allocation]}
        repo.set_attempt_state(s, a4, "Running")
    answer = ask()
    assert answer["action"] == "restart" and answer["attempt_number"] == 4 and answer["hosts"] == ["node3"]
