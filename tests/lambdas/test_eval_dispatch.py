"""eval_dispatch as AWS would invoke it: a "checkpoint committed" EventBridge event and a context.

Real parts: the API over HTTP (uvicorn in this process, SQLite store), a real checkpoint written
by the trainer (`python -m trainer.train`, a few steps of pythia-tiny), the real sampler process
(`trainer.eval_sampler`) and the real `slack_sdk.WebClient`. Slack's servers cannot be reached
from here, so the WebClient talks to a local stand-in speaking Slack's Web API wire format
(`tests/helpers/slack_standin.py`, reached with `WebClient(base_url=...)` via AERIE_SLACK_API_URL).
"""

from __future__ import annotations

import copy
import sys
from datetime import datetime, timezone

import pytest

from aerie_contracts import DetailType
from lambdas import eval_dispatch, eval_posting, slack_blocks
from lambdas.cron import parse_cron
from orchestrator.spec import JobSpec
from orchestrator.store import repo
from tests.helpers.tiny_trainer import train, trainer_env, write_tiny_config

CHANNEL = "#eval-pythia"
PROMPTS = ["def main(", "import os\n"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> dict:
    """A real training run: 4 steps of pythia-tiny, checkpoints at steps 2 and 4 (synchronous)."""
    root = tmp_path_factory.mktemp("trained")
    config = write_tiny_config(
        root / "config.yaml",
        root / "cache",
        checkpoint={"uri": str(root / "ckpt"), "every_steps": 2, "async": False},
    )
    proc = train(config, trainer_env(root, AERIE_CHECKPOINT_URI=""))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {"config": str(config), "ckpt": root / "ckpt"}


def make_job(api, trained, steps=(2,), **eval_extra) -> tuple[str, list[dict]]:
    """A job whose attempt committed the given checkpoints; returns its id and the commit events."""
    spec = JobSpec.model_validate(
        {
            "name": "evaljob",
            "entrypoint": ["python", "-m", "trainer.train"],
            "args": ["--config", trained["config"]],
            "eval": {
                "prompts": PROMPTS,
                "slack_channel": CHANNEL,
                "raters_needed": 3,
                "sampling": {"max_new_tokens": 8, "temperature": 0.8, "top_k": 20, "seed": 1},
                **eval_extra,
            },
        }
    ).model_dump(mode="json")
    with api.db.session() as s:
        job = repo.create_job(s, spec, "default")
        repo.set_job_state(s, job, "InProgress")
        attempt = repo.create_attempt(s, job, 1)
        repo.set_attempt_state(s, attempt, "Running")
        for step in steps:
            repo.record_checkpoint(s, attempt, step, str(trained["ckpt"] / f"step_{step:08d}"), {})
        job_id = job.id
    with api.db.session() as s:
        events = [
            repo.eventbridge(e)
            for e in repo.list_events(s, repo.get_job(s, "default", job_id))
            if e.detail_type == DetailType.CHECKPOINT_COMMITTED
        ]
    return job_id, events


def test_posts_one_valid_block_kit_message_per_prompt(api, slack_env, trained):
    job_id, [event] = make_job(api, trained)
    result = eval_dispatch.handler(copy.deepcopy(event), api.context("eval_dispatch"))
    assert result["action"] == "posted" and len(result["posted"]) == len(PROMPTS)
    messages = slack_env.messages(CHANNEL)
    assert len(messages) == len(PROMPTS)
    with api.db.session() as s:
        samples = repo.eval_samples_of(s, repo.get_job(s, "default", job_id))
        assert [x.slack_ts for x in samples] == [m["ts"] for m in messages]
        assert all(x.answer is not None and x.meta["tokens"] == 2 * 4 * 32 for x in samples)
    for message, sample in zip(messages, samples):
        slack_blocks.validate(message["blocks"])  # what the stand-in enforced too
        text = "\n".join(str(b) for b in message["blocks"])
        assert "step" in text.lower() and "Tokens seen" in text and "Loss" in text
        buttons = next(b for b in message["blocks"] if b["type"] == "actions")["elements"]
        assert [b["value"] for b in buttons] == [f"{sample.id}|{n}" for n in "12345h"]
        assert message["metadata"]["event_payload"]["sample_id"] == sample.id


def test_redelivered_events_post_nothing_twice(api, slack_env, trained, monkeypatch):
    """Acceptance 3: the same event delivered three times, then through the real dispatcher."""
    runs = []
    real = eval_dispatch.run_sampler
    monkeypatch.setattr(eval_dispatch, "run_sampler", lambda *a, **k: runs.append(1) or real(*a, **k))
    job_id, [event] = make_job(api, trained)
    results = [eval_dispatch.handler(copy.deepcopy(event), api.context("eval_dispatch")) for _ in range(3)]
    assert [r["action"] for r in results] == ["posted", "none", "none"]
    assert len(runs) == 1, "a redelivery must not sample again"
    dispatcher = api.dispatcher("eval_dispatch", DetailType.CHECKPOINT_COMMITTED, eval_dispatch.handler)
    dispatcher.deliver_once()
    assert len(slack_env.calls_of("chat.postMessage")) == len(PROMPTS)
    assert len(slack_env.messages(CHANNEL)) == len(PROMPTS)
    with api.db.session() as s:
        statuses = {
            e.status
            for e in repo.list_events(s, repo.get_job(s, "default", job_id))
            if e.detail_type == DetailType.CHECKPOINT_COMMITTED
        }
    assert statuses == {"delivered"}


def test_rate_limited_post_is_retried_after_retry_after(api, slack_env, trained):
    """Acceptance 3: a 429 with Retry-After from the stand-in; the WebClient waits and retries."""
    _job_id, [event] = make_job(api, trained)
    slack_env.rate_limit(calls=1, retry_after=1)
    result = eval_dispatch.handler(event, api.context("eval_dispatch"))
    assert len(result["posted"]) == len(PROMPTS)
    posts = slack_env.calls_of("chat.postMessage")
    assert [c.status for c in posts] == [429] + [200] * len(PROMPTS)
    assert posts[1].t - posts[0].t >= 1.0
    assert len(slack_env.messages(CHANNEL)) == len(PROMPTS)


def test_a_dead_posters_message_is_found_not_posted_again(api, slack_env, trained, monkeypatch):
    """The crash window: a delivery posted, then died before recording the ts. Its claim expires,
    and the next delivery finds the message by the sample id in its metadata."""
    job_id, [event] = make_job(api, trained)
    calls = []
    real_call = eval_dispatch.Api.call

    def dies_after_posting(self, method, path, body=None):
        if path.endswith("/posted") and not calls:
            calls.append(path)
            raise ConnectionError("the Lambda was killed here")
        return real_call(self, method, path, body)

    monkeypatch.setattr(eval_dispatch.Api, "call", dies_after_posting)
    with pytest.raises(ConnectionError):
        eval_dispatch.handler(copy.deepcopy(event), api.context("eval_dispatch"))
    assert len(slack_env.messages(CHANNEL)) == 1
    monkeypatch.setattr(eval_posting, "LEASE_S", 0.5)  # let the dead delivery's claim expire
    import time

    time.sleep(0.6)
    eval_dispatch.handler(copy.deepcopy(event), api.context("eval_dispatch"))
    assert len(slack_env.calls_of("chat.postMessage")) == len(PROMPTS)
    with api.db.session() as s:
        samples = repo.eval_samples_of(s, repo.get_job(s, "default", job_id))
        assert sorted(x.slack_ts for x in samples) == [m["ts"] for m in slack_env.messages(CHANNEL)]


def test_every_second_good_checkpoint(api, slack_env, trained):
    _job_id, events = make_job(api, trained, steps=(2, 4), every_n_checkpoints=2)
    first = eval_dispatch.handler(events[0], api.context("eval_dispatch"))
    assert first["action"] == "none" and "every 2" in first["why"]
    second = eval_dispatch.handler(events[1], api.context("eval_dispatch"))
    assert second["action"] == "posted" and second["step"] == 4
    assert len(slack_env.messages(CHANNEL)) == len(PROMPTS)


def test_cron_schedule_samples_the_first_checkpoint_after_each_firing(api, slack_env, trained, monkeypatch):
    """Commit times are arranged in the store (10:05 job, 10:10 and 11:01 checkpoints, hourly schedule).
    The sampler is stubbed here: which checkpoints are chosen is what this test is about."""
    monkeypatch.setattr(eval_dispatch, "run_sampler", lambda spec, uri, prompts, sampling: ["stub"] * len(prompts))
    job_id, events = make_job(api, trained, steps=(2, 4), schedule="0 * * * *")
    with api.db.session() as s:
        job = repo.get_job(s, "default", job_id)
        job.created_at = _t("2026-01-01T10:05")
        for c, when in zip(repo.list_checkpoints(s, job), ("2026-01-01T10:10", "2026-01-01T11:01")):
            c.created_at = _t(when)
    first = eval_dispatch.handler(events[0], api.context("eval_dispatch"))
    assert first["action"] == "none" and "has not fired" in first["why"]
    assert eval_dispatch.handler(events[1], api.context("eval_dispatch"))["action"] == "posted"
    assert eval_dispatch.handler(events[1], api.context("eval_dispatch"))["action"] == "none"  # redelivered
    assert len(slack_env.messages(CHANNEL)) == len(PROMPTS)


def test_no_eval_section_does_nothing(api, slack_env, trained):
    with api.db.session() as s:
        job = repo.create_job(s, {"name": "plain", "entrypoint": ["x"]}, "default")
        attempt = repo.create_attempt(s, job, 1)
        repo.record_checkpoint(s, attempt, 2, "/nowhere/step_00000002", {})
        event = next(
            repo.eventbridge(e) for e in repo.list_events(s, job) if e.detail_type == DetailType.CHECKPOINT_COMMITTED
        )
    assert eval_dispatch.handler(event, api.context("eval_dispatch"))["action"] == "none"
    assert slack_env.calls == []


def _t(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=timezone.utc).timestamp()


def test_cron_schedule_fires_between():
    every_6h = parse_cron("0 */6 * * *")
    assert every_6h.fired_between(_t("2026-01-01T05:30"), _t("2026-01-01T06:00"))
    assert not every_6h.fired_between(_t("2026-01-01T06:00"), _t("2026-01-01T11:59"))
    mondays = parse_cron("30 9 * * 1")
    assert mondays.fired_between(_t("2026-01-01T00:00"), _t("2026-01-06T00:00"))  # Mon 5 Jan 09:30
    assert not mondays.fired_between(_t("2026-01-06T00:00"), _t("2026-01-12T09:29"))
    assert parse_cron("* * * * *").fired_between(_t("2026-01-01T00:00"), _t("2026-01-01T00:01"))
    for bad in ("* * * *", "61 * * * *", "*/0 * * * *", "a * * * *"):
        with pytest.raises(ValueError):
            parse_cron(bad)
    with pytest.raises(ValueError):
        JobSpec.model_validate({"name": "x", "entrypoint": ["x"], "eval": {"schedule": "0 99 * * *"}})
    with pytest.raises(ValueError):
        JobSpec.model_validate(
            {"name": "x", "entrypoint": ["x"], "eval": {"schedule": "0 * * * *", "every_n_checkpoints": 2}}
        )


def test_the_sampler_command_is_an_argv_never_a_shell_string(monkeypatch):
    monkeypatch.delenv("AERIE_EVAL_SAMPLER_COMMAND", raising=False)
    assert eval_dispatch.sampler_command() == [sys.executable, "-m", "trainer.eval_sampler"]
    monkeypatch.setenv("AERIE_EVAL_SAMPLER_COMMAND", '["/opt/py/bin/python", "-m", "trainer.eval_sampler"]')
    assert eval_dispatch.sampler_command()[0] == "/opt/py/bin/python"
    for bad in ("python -m trainer.eval_sampler", "[]", '["python", 3]'):
        monkeypatch.setenv("AERIE_EVAL_SAMPLER_COMMAND", bad)
        with pytest.raises(eval_dispatch.SamplerFailed, match="JSON list of strings"):
            eval_dispatch.sampler_command()
