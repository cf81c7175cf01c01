"""Fenced commits against a real API over HTTP (uvicorn in this process, real SQLite store) and the
real loopback S3 server: only the job's current attempt makes a checkpoint count; a superseded
attempt's commit is refused before its manifest, or, if it slipped past the check, after it — and
either way `last_good` (which consults the record) never returns it; two attempts saving the same
step never mix their objects."""

from __future__ import annotations

import boto3
import httpx
import pytest

from aerie_checkpoint import fence, manifest
from orchestrator.settings import Settings
from orchestrator.store import repo
from tests.helpers.live_api import start_live_api


@pytest.fixture
def api(aerie_home, s3_env):
    live = start_live_api(Settings())
    yield live
    live.stop()


def _job(api, base: str) -> str:
    with api.db.session() as s:
        job = repo.create_job(
            s,
            {"name": "fenced", "backend": "local", "entrypoint": ["x"], "checkpoint": {"s3_uri": base}},
            "default",
        )
        repo.set_job_state(s, job, "InProgress")
        return job.id


def _attempt(api, job_id: str, number: int) -> fence.CommitGate:
    """Attempt `number` of the job, running, and the gate its ranks would build from their env."""
    with api.db.session() as s:
        job = repo.get_job(s, "default", job_id)
        attempt = repo.create_attempt(s, job, number)
        repo.set_attempt_state(s, attempt, "Running")
        token = repo.mint_token(s, "agent", attempt_id=attempt.id)
    environ = {
        "AERIE_API": api.url,
        "AERIE_AGENT_TOKEN": token,
        "AERIE_ATTEMPT": f"{job_id}-a{number}",
        "AERIE_ATTEMPT_NUMBER": str(number),
    }
    gate = fence.CommitGate.from_env(environ)
    assert gate is not None and gate.attempt == number
    gate.record_budget_s = 2.0
    return gate


def _fail(api, job_id: str, number: int) -> None:
    with api.db.session() as s:
        repo.set_attempt_state(s, repo.get_attempt(s, f"{job_id}-a{number}"), "Failed", {"kind": "node.lost"})


def _shards(uri: str, rank_bytes: dict[int, int]) -> list[str]:
    bucket, key = uri[len("s3://") :].split("/", 1)
    client = boto3.client("s3")
    client.put_object(Bucket=bucket, Key=f"{key}/.metadata", Body=b"meta")
    for rank, size in rank_bytes.items():
        client.put_object(Bucket=bucket, Key=f"{key}/__{rank}_0.distcp", Body=bytes([rank]) * size)
    return [".metadata", *(f"__{r}_0.distcp" for r in rank_bytes)]


def _records(api, job_id: str) -> dict[str, tuple[str, int | None, str | None]]:
    with api.db.session() as s:
        rows = repo.list_checkpoints(s, repo.get_job(s, "default", job_id))
        return {c.uri: (c.state, c.size_bytes, c.attempt_id) for c in rows}


def test_the_current_attempt_commits_under_its_epoch_with_its_size(api, s3_prefix):
    job_id = _job(api, s3_prefix)
    prefix = f"{s3_prefix}/{job_id}"
    gate = _attempt(api, job_id, 1)
    uri = manifest.checkpoint_uri(prefix, 10, 1)
    assert uri.endswith("/step_00000010/attempt_0001")
    _shards(uri, {0: 1000, 1: 2000})
    written = fence.commit(uri, gate, step=10, tokens=640, attempt=1, attempt_id=gate.attempt_id)
    assert written["attempt"] == 1 and written["attempt_id"] == f"{job_id}-a1" and written["total_bytes"] == 3004
    assert _records(api, job_id) == {uri: ("good", 3004, f"{job_id}-a1")}
    recorded = gate.recorded()
    assert recorded == {uri: "good"}
    assert manifest.last_good(prefix, recorded=recorded) == uri
    assert manifest.parse_uri(uri) == manifest.CheckpointRef(prefix, 10, 1)


def test_a_superseded_attempt_writes_no_manifest_and_every_record_is_refused(api, s3_prefix):
    job_id = _job(api, s3_prefix)
    prefix = f"{s3_prefix}/{job_id}"
    old = _attempt(api, job_id, 1)
    _fail(api, job_id, 1)
    _attempt(api, job_id, 2)
    uri = manifest.checkpoint_uri(prefix, 20, 1)
    _shards(uri, {0: 500})
    with pytest.raises(fence.Superseded, match="no longer its job's current attempt"):
        fence.commit(uri, old, step=20, attempt=1, attempt_id=old.attempt_id)
    assert manifest.read_manifest(uri) is None  # stopped before writing it
    [info] = manifest.list_checkpoints(prefix)
    assert info.state == "incomplete" and info.attempt == 1
    # Every door is shut: the trainer's own route and the agent's checkpoint_committed route.
    headers = {"Authorization": f"Bearer {old.token}"}
    body = {"step": 20, "uri": uri, "meta": {}}
    r = httpx.post(f"{api.url}/v1/attempts/{old.attempt_id}/checkpoints", json=body, headers=headers)
    assert r.status_code == 409, r.text
    r = httpx.post(f"{api.url}/v1/attempts/{old.attempt_id}/nodes/algo-1/checkpoints", json=body, headers=headers)
    assert r.status_code == 409, r.text
    assert _records(api, job_id) == {}
    view = httpx.get(f"{api.url}/v1/attempts/{old.attempt_id}", headers=headers).json()
    assert view == {"id": old.attempt_id, "job_id": job_id, "number": 1, "state": "Failed", "current": False}


def test_a_zombie_that_passed_the_check_is_refused_at_the_record_and_marked_bad(api, s3_prefix, monkeypatch):
    """The race: the check answered 'current', then the attempt was superseded before the manifest
    PUT landed. The record (checked in the attempt row's own transaction) refuses it; the zombie
    marks its manifest BAD; `last_good` with the record would skip it even without the marker."""
    job_id = _job(api, s3_prefix)
    prefix = f"{s3_prefix}/{job_id}"
    old = _attempt(api, job_id, 1)
    good = manifest.checkpoint_uri(prefix, 10, 1)
    _shards(good, {0: 100})
    fence.commit(good, old, step=10, attempt=1, attempt_id=old.attempt_id)

    real_check = old.check

    def check_then_lose_the_race() -> None:
        real_check()  # still current here ...
        _fail(api, job_id, 1)  # ... superseded before the manifest is written
        _attempt(api, job_id, 2)

    monkeypatch.setattr(old, "check", check_then_lose_the_race)
    zombie = manifest.checkpoint_uri(prefix, 20, 1)
    _shards(zombie, {0: 100})
    with pytest.raises(fence.Superseded):
        fence.commit(zombie, old, step=20, attempt=1, attempt_id=old.attempt_id)
    assert manifest.read_manifest(zombie) is not None  # it did write one ...
    assert "fenced" in manifest.verify(zombie).reasons[0]  # ... and flagged it
    assert set(_records(api, job_id)) == {good}
    assert not old.mark_bad(good, "restore failed")  # a zombie may not take resume points away (409)
    assert _records(api, job_id)[good][0] == "good"
    # Even had the marker never been written (the zombie killed right after its PUT):
    bucket, key = zombie[len("s3://") :].split("/", 1)
    boto3.client("s3").delete_object(Bucket=bucket, Key=f"{key}/BAD")
    assert manifest.last_good(prefix) == zombie  # S3 alone cannot tell ...
    recorded = {good: "good"}
    assert manifest.last_good(prefix, recorded=recorded) == good  # ... the record can
    states = {c.uri: c.state for c in manifest.list_checkpoints(prefix, recorded)}
    assert states == {good: "good", zombie: "incomplete"}


def test_two_attempts_saving_one_step_never_mix(api, s3_prefix):
    """A zombie of attempt 1 finishes its step-20 upload after attempt 2 committed step 20: its
    objects sit in attempt 1's directory, attempt 2's manifest lists only its own, and the zombie's
    late commit is refused."""
    job_id = _job(api, s3_prefix)
    prefix = f"{s3_prefix}/{job_id}"
    old = _attempt(api, job_id, 1)
    mine = manifest.checkpoint_uri(prefix, 20, 1)
    _shards(mine, {0: 300})  # rank 0's part, then the node froze
    _fail(api, job_id, 1)
    new = _attempt(api, job_id, 2)
    theirs = manifest.checkpoint_uri(prefix, 20, 2)
    _shards(theirs, {0: 300, 1: 300})
    fence.commit(theirs, new, step=20, attempt=2, attempt_id=new.attempt_id)
    _shards(mine, {1: 999})  # the zombie's rank 1 resumes and finishes its upload
    with pytest.raises(fence.Superseded):
        fence.commit(mine, old, step=20, attempt=1, attempt_id=old.attempt_id)
    listed = manifest.read_manifest(theirs)["objects"]
    assert sorted(o["key"] for o in listed) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    assert [o["size"] for o in listed if o["key"] == "__1_0.distcp"] == [300]
    recorded = new.recorded()
    assert manifest.last_good(prefix, recorded=recorded) == theirs
    assert {(c.attempt, c.state) for c in manifest.list_checkpoints(prefix, recorded)} == {
        (1, "incomplete"),
        (2, "good"),
    }


def test_outside_aerie_there_is_no_gate_and_the_layout_has_no_epoch(tmp_path):
    assert fence.CommitGate.from_env({}) is None
    uri = manifest.checkpoint_uri(f"file://{tmp_path}", 5)
    assert uri.endswith("/step_00000005")
    (tmp_path / "step_00000005").mkdir()
    (tmp_path / "step_00000005" / "__0_0.distcp").write_bytes(b"x")
    written = fence.commit(uri, None, step=5)
    assert "attempt" not in written and manifest.last_good(f"file://{tmp_path}") == uri
    assert manifest.parse_uri(uri) == manifest.CheckpointRef(f"file://{tmp_path}", 5, None)
