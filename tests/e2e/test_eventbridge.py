"""A control plane with `AERIE_EVENT_BUS` publishes to EventBridge, and the deployed chain_restart
restarts the job from what the bus delivers, once, however often it is delivered.

Real parts: `aerie up` (subprocess) and a real job on the local backend whose attempt 1 exits 3.
AWS's services cannot run here, so EventBridge, SQS and Secrets Manager are moto's server on
loopback, set up as the CDK stack sets them up: a custom bus, a rule with the stack's own
pattern for failed attempts (`aerie_contracts.events.ATTEMPT_FAILED_PATTERN`), a queue as its
target standing in for the Lambda target (a queue keeps the exact event the function would get),
and the service token as a secret. The handler then runs as the Lambda runtime would run it: a
fresh process with only the function's environment (`AERIE_API`, `AERIE_SERVICE_TOKEN_ARN`, as
`infra/aws/aerie_cdk/handlers.py` sets it), reading the token from Secrets Manager.

The duplicate is not made up: the control plane is SIGKILLed right after PutEvents took the
failure and before the outbox row was marked (failpoint `events.after_publish:...`), so after its
restart it publishes the same event again, with the same `detail.seq`.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import uuid

import boto3
import pytest

from aerie_contracts import events as contract_events
from devtools.harness.control_plane import REPO, ControlPlane, event_story, write_spec

# Not timing-sensitive: `make test` runs it with the unit tests, on two workers (tests/conftest.py).
pytestmark = [pytest.mark.slow, pytest.mark.side_by_side]

FAILPOINT = "events.after_publish:Aerie Attempt State Change:Failed"
# Attempt 1 fails with exit code 3 (retryable); later attempts succeed.
FLAKY = ["python", "-c", "import os, sys; sys.exit(3 if os.environ['AERIE_ATTEMPT_NUMBER'] == '1' else 0)"]

RUN_AS_LAMBDA = """
import json, sys
from lambdas import chain_restart

class Context:  # what AWS Lambda's context offers; nothing Aerie-specific
    function_name = "aerie-chain-restart"
    aws_request_id = "req-1"
    def get_remaining_time_in_millis(self):
        return 60_000

print(json.dumps(chain_restart.handler(json.loads(sys.stdin.read()), Context())))
"""


@pytest.fixture
def aws(s3_env):
    """The stack's bus, failed-attempt rule (SQS target) and service-token secret, on moto."""
    events, sqs, sm = boto3.client("events"), boto3.client("sqs"), boto3.client("secretsmanager")
    bus = f"aerie-{uuid.uuid4().hex[:8]}"
    events.create_event_bus(Name=bus)
    queue = sqs.create_queue(QueueName=f"{bus}-chain-restart")["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    events.put_rule(
        Name=f"{bus}-attempt-failed", EventBusName=bus, EventPattern=json.dumps(contract_events.ATTEMPT_FAILED_PATTERN)
    )
    events.put_targets(Rule=f"{bus}-attempt-failed", EventBusName=bus, Targets=[{"Id": "chain", "Arn": arn}])
    token = f"aer_ser_{secrets.token_urlsafe(24)}"
    secret = sm.create_secret(Name=f"{bus}/service-token", SecretString=token)["ARN"]
    return {"bus": bus, "queue": queue, "token": token, "secret_arn": secret}


def receive(queue: str, want: int, timeout_s: float = 60) -> list[dict]:
    import time

    sqs = boto3.client("sqs")
    got: list[dict] = []
    deadline = time.time() + timeout_s
    while len(got) < want and time.time() < deadline:
        for m in sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=10, WaitTimeSeconds=1).get("Messages", []):
            got.append(json.loads(m["Body"]))
            sqs.delete_message(QueueUrl=queue, ReceiptHandle=m["ReceiptHandle"])
    return got


def run_lambda(event: dict, api_url: str, secret_arn: str) -> dict:
    """chain_restart in a fresh process with only a Lambda function's environment."""
    env = {k: v for k, v in os.environ.items() if k.startswith("AWS_") or k in ("PATH", "HOME", "LANG")}
    env.update({"AERIE_API": api_url, "AERIE_SERVICE_TOKEN_ARN": secret_arn})
    r = subprocess.run(
        [sys.executable, "-c", RUN_AS_LAMBDA],
        input=json.dumps(event),
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_a_failed_attempt_reaches_the_deployed_chain_restart_through_eventbridge(tmp_path, aws):
    home = tmp_path / "home"
    home.mkdir()
    cp = ControlPlane(
        home,
        extra_env={"AERIE_EVENT_BUS": aws["bus"], "AERIE_SERVICE_TOKEN": aws["token"], "AERIE_FAILPOINT": FAILPOINT},
    ).start()
    try:
        spec = write_spec(
            tmp_path / "spec.json",
            name="via-eventbridge",
            entrypoint=FLAKY,
            resources={"instance_count": 1, "procs_per_node": 1},
            retry={"max_restarts": 2},
        )
        cp.cli("submit", str(spec), check=True)
        assert cp.proc is not None
        cp.proc.wait(timeout=120)
        assert cp.proc.returncode == -9, "the control plane should have died right after publishing the failure"
        cp.env.pop("AERIE_FAILPOINT")
        cp.start()

        # Published before the crash and again after it: two copies, one outbox seq.
        first, second = receive(aws["queue"], want=2)
        for event in (first, second):
            assert event["source"] == "aerie.orchestrator" and event["detail-type"] == "Aerie Attempt State Change"
            assert event["detail"]["state"] == "Failed" and event["detail"]["attempt"] == 1
            assert event["detail"]["reason"]["exit_code"] == 3
        assert first["detail"] == second["detail"] and first["id"] != second["id"]
        rows = cp.get("/v1/jobs/via-eventbridge/events")
        [row] = [r for r in rows if r["event"]["detail"].get("state") == "Failed"]
        assert first["detail"]["seq"] == row["seq"] and row["status"] == "delivered"

        # Nothing runs in-process with a bus: the job waits for the deployed handler.
        assert [a["number"] for a in cp.job("via-eventbridge")["attempt_list"]] == [1]
        results = [run_lambda(e, cp.url, aws["secret_arn"]) for e in (first, second, first)]
        assert [r["action"] for r in results] == ["restart", "none", "none"]

        job = cp.wait_state("via-eventbridge", {"Completed", "Failed"}, timeout_s=120)
        assert job["state"] == "Completed" and [a["number"] for a in job["attempt_list"]] == [1, 2]
        assert event_story(cp.events("via-eventbridge")).count("attempt 2 Running") == 1
        # Only failures matched the rule: the running/completed events went to the bus, not the queue.
        assert receive(aws["queue"], want=1, timeout_s=3) == []
    finally:
        cp.stop()
        cp.cleanup_nodes()
