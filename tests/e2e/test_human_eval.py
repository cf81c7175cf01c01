"""Acceptance 1 of the human eval loop, end to end on the local backend.

A real `aerie up` (controller, dispatcher, in-process handlers), a real job (the trainer under the
agent, a few steps of pythia-tiny) that commits real DCP checkpoints; `eval_dispatch` samples them
with `trainer.eval_sampler` and posts with the real `slack_sdk.WebClient`. Slack's servers cannot
be reached from here, so the control plane's WebClient is pointed (`WebClient(base_url=...)`, the
AERIE_SLACK_API_URL setting) at a local stand-in speaking Slack's Web API wire format. Three
people's clicks are sent as Slack sends them (signed form-encoded `payload`), then `aerie ratings`
must show the mean score and hallucination rate of that step.
"""

from __future__ import annotations

import re
import subprocess
import sys

import httpx
import pytest

from devtools.harness.control_plane import ControlPlane, write_spec
from lambdas import slack_blocks
from tests.helpers.slack_standin import block_actions_payload, signed_request
from tests.helpers.tiny_trainer import write_tiny_config
from tests.helpers.wait import wait_for

CHANNEL = "#eval-e2e"
PROMPTS = ["def main(", "class Parser:"]


@pytest.fixture
def cp(tmp_path, slack_standin):
    plane = ControlPlane(
        tmp_path / "home",
        extra_env={
            **slack_standin.env(),
            "OMP_NUM_THREADS": "1",
        },
    )
    plane.home.mkdir()
    plane.start()
    yield plane
    plane.stop()
    plane.cleanup_nodes()
    # `aerie up` starts a loopback S3 server that outlives it on purpose; this test's must go.
    subprocess.run(
        [sys.executable, "-m", "devtools.devstack", "down"],
        env=plane.env,
        cwd=plane.home,
        capture_output=True,
        timeout=60,
    )


# Not timing-sensitive: `make test` runs it with the unit tests, on two workers (tests/conftest.py);
# its hang floor and start-up grace are 120 s.
@pytest.mark.slow
@pytest.mark.side_by_side
def test_checkpoint_to_slack_to_ratings(cp, slack_standin, tmp_path):
    config = write_tiny_config(tmp_path / "train.yaml", tmp_path / "data-cache", checkpoint={"async": False})
    spec = write_spec(
        tmp_path / "job.json",
        name="eval-e2e",
        entrypoint=["python", "-m", "trainer.train"],
        args=["--config", str(config)],
        resources={"instance_count": 1, "procs_per_node": 1},
        checkpoint={"s3_uri": str(tmp_path / "ckpt"), "every_steps": 4, "keep_last": 2},
        eval={
            "prompts": PROMPTS,
            "slack_channel": CHANNEL,
            "raters_needed": 3,
            "sampling": {"max_new_tokens": 12, "temperature": 0.7, "top_k": 40, "seed": 3},
        },
        health={"startup_grace_s": 120, "hang_floor_s": 120},
    )
    r = cp.cli("submit", str(spec), "--follow", timeout=400)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    [ckpt] = cp.get("/v1/jobs/eval-e2e/checkpoints")
    assert ckpt["step"] == 4

    # The dispatcher delivers "checkpoint committed" to eval_dispatch: one message per prompt.
    messages = wait_for(
        lambda: len(slack_standin.messages(CHANNEL)) == len(PROMPTS) and slack_standin.messages(CHANNEL),
        240,
        "the eval messages at the Slack stand-in",
    )
    for message, prompt in zip(messages, PROMPTS):
        slack_blocks.validate(message["blocks"])
        fields = [f["text"] for f in message["blocks"][1]["fields"]]
        assert prompt in message["blocks"][2]["text"]["text"] and "*Step*\n4" in fields
        assert "*Tokens seen*\n512" in fields and any(re.fullmatch(r"\*Loss\*\n\d+\.\d{4}", f) for f in fields)

    # Three people rate both samples; one flags a hallucination on the first.
    channel = slack_standin.channel_id(CHANNEL)
    clicks = [("U1", "rate_4"), ("U2", "rate_3"), ("U3", "rate_2"), ("U3", "hallucination")]
    for i, message in enumerate(messages):
        for user, action in clicks if i == 0 else clicks[:3]:
            body, headers = signed_request(block_actions_payload(message, channel, user, action))
            resp = httpx.post(cp.url + "/v1/slack/interactions", content=body, headers=headers, timeout=30)
            assert resp.status_code == 200, resp.text
    wait_for(lambda: len(slack_standin.calls_of("chat.update")) == 7, 60, "the tallies updated in place")

    out = cp.cli("ratings", "eval-e2e", check=True).stdout
    print(out)
    row = next(line for line in out.splitlines() if "│ 4 " in line or line.strip().startswith("4 "))
    assert "3.00" in row and "17%" in row and "yes" in row, out  # mean (4+3+2)/3; 1 flag in 6 ratings
    [api_row] = cp.get("/v1/jobs/eval-e2e/ratings")
    assert api_row["mean_score"] == pytest.approx(3.0) and api_row["hallucination_rate"] == pytest.approx(1 / 6)

    # Nothing was posted twice along the way (the dispatcher delivers at least once).
    assert len(slack_standin.calls_of("chat.postMessage")) == len(PROMPTS)
