"""The `sagemaker` backend: one SageMaker training job per launched attempt, through boto3.

An in-place attempt (issue #22) creates no training job: the failed attempt's agents are still up
inside its running job (`AERIE_IN_PLACE_WAIT_S`) and restart their worker groups for it, told so by
the control plane (GET .../next). Its handle names the same training job, with the attempt's id
and a rendezvous port of its own; while the job runs on, the attempt's outcome is what its agents
report (`outcomes_from_agents`). The training job ends when the Aerie job does (the agents exit),
on a relaunch (StopTrainingJob, then a new job), or when an instance is lost; an in-place attempt
whose training job has ended meanwhile is launched as a new one.

Launch sends `CreateTrainingJob` (the request: `sagemaker_request`) and the image's agent reports
to the control plane from inside the container. Poll maps `DescribeTrainingJob` onto Aerie's
states (`sagemaker_state`); stop is `StopTrainingJob`; logs come from CloudWatch Logs
(`/aws/sagemaker/TrainingJobs`, one stream per instance, `<job>/algo-N-<epoch>`).
`event_from_sagemaker` turns SageMaker's EventBridge "SageMaker Training Job State Change" into
Aerie's "Aerie Attempt State Change", so chaining reacts to either the same way.

Hot spares (`resources.spare_nodes`, issue #23) are extra instances of the training job
(`InstanceCount` = nodes + spares): `AERIE_SPARE_HOSTS` names them (`algo-N+1..`) on every
instance, their agents wait for a failed node's rank slot, and an in-place attempt's handle swaps
them in. A running training job cannot grow, so a used spare comes back only with a relaunch.

AWS cannot be reached from this project's machines: the tests drive this module through
botocore's `Stubber`, which checks every request against the real SageMaker and CloudWatch Logs
service models.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any

from aerie_contracts import env as aerie_env
from aerie_contracts import memckpt
from aerie_contracts.failures import FailureKind
from aerie_contracts.restarts import NOT_REUSABLE
from aerie_contracts.sagemaker_api import TrainingJobStatus
from aerie_contracts.states import AttemptState

# The event mapping lives with the handlers (it must ship to AWS Lambda alone).
from lambdas.sagemaker_events import event_from_sagemaker  # noqa: F401 - re-exported for callers
from orchestrator.backends import in_place
from orchestrator.backends.base import Backend, LaunchRequest
from orchestrator.backends.nodeenv import in_place_on
from orchestrator.backends.sagemaker_request import (
    IN_PLACE_WAIT_S,
    create_training_job_request,
    in_place_port,
    spare_hosts,
)
from orchestrator.backends.sagemaker_state import SageMakerPollResult, poll_result
from recovery.modes import memory_tier_off

log = logging.getLogger("aerie.sagemaker")

LOG_GROUP = "/aws/sagemaker/TrainingJobs"


class SageMakerBackend(Backend):
    name = "sagemaker"
    # After a failed worker group, an agent waits this long for an in-place successor, then exits
    # (and the training job ends with it).
    in_place_wait_s = IN_PLACE_WAIT_S

    def __init__(
        self,
        client: Any = None,
        logs_client: Any = None,
        region: str | None = None,
        defaults: dict[str, Any] | None = None,
    ):
        self._client = client
        self._logs = logs_client
        self.region = region
        # Request fields every job gets unless its spec says otherwise (RoleArn, VpcConfig, ...).
        self.defaults = dict(defaults or {})

    @classmethod
    def from_env(cls) -> SageMakerBackend:
        """Defaults from AERIE_SAGEMAKER_ROLE_ARN, _SUBNETS and _SECURITY_GROUPS (comma-separated)."""
        env = os.environ
        defaults: dict[str, Any] = {}
        if env.get(aerie_env.SAGEMAKER_ROLE_ARN):
            defaults["RoleArn"] = env[aerie_env.SAGEMAKER_ROLE_ARN]
        if env.get(aerie_env.SAGEMAKER_SUBNETS):
            defaults["VpcConfig"] = {
                "Subnets": _csv(env[aerie_env.SAGEMAKER_SUBNETS]),
                "SecurityGroupIds": _csv(env.get(aerie_env.SAGEMAKER_SECURITY_GROUPS, "")),
            }
        return cls(region=_region(), defaults=defaults)

    @staticmethod
    def available() -> bool:
        """Configured when boto3 finds credentials and a region (AERIE_SAGEMAKER=0 turns it off)."""
        if os.environ.get(aerie_env.SAGEMAKER, "").lower() in {"0", "false", "no", "off"}:
            return False
        return _region() is not None and _credentials() is not None

    def check(self) -> tuple[bool, str]:
        region, creds = _region(), _credentials()
        if region is None:
            return False, "no AWS region configured (AWS_REGION)"
        if creds is None:
            return False, "no AWS credentials found"
        return True, f"credentials ({creds.method}) and region {region} configured (not contacted)"

    @property
    def client(self) -> Any:
        if self._client is None:
            import boto3

            self._client = boto3.client("sagemaker", region_name=self.region)
        return self._client

    @property
    def logs_client(self) -> Any:
        if self._logs is None:
            import boto3

            self._logs = boto3.client("logs", region_name=self.region)
        return self._logs

    # --- launch -----------------------------------------------------------------------------

    def launch(self, request: LaunchRequest) -> dict[str, Any]:
        # The in-memory checkpoint tier: its interval and this attempt's replication key go in the
        # Environment (the same on every instance); each node derives its area and the ring's
        # endpoints (agent.memckpt.platform).
        key = memckpt.new_key() if memory_tier_off(request.spec.model_dump(), self.name) is None else None
        body = create_training_job_request(request, self.defaults, self.in_place_wait_s, memory_key=key)
        name = body["TrainingJobName"]
        try:
            self.client.create_training_job(**body)
        except Exception as exc:
            # Idempotent: the controller may launch an attempt again after a crash.
            if _error_code(exc) != "ResourceInUse":
                raise
            if key:  # the running training job's nodes hold the key it was created with
                described = self.client.describe_training_job(TrainingJobName=name)
                key = (described.get("Environment") or {}).get(aerie_env.MEMORY_CHECKPOINT_KEY) or key
        count = request.spec.resources.instance_count
        hosts = [f"algo-{i + 1}" for i in range(count)]
        handle: dict[str, Any] = {"training_job_name": name, "hosts": hosts, "region": self.region}
        if in_place_on(request.spec):
            handle["agents_wait"] = True  # they outlive worker groups: outcomes_from_agents
        if key:
            handle[memckpt.HANDLE_KEY] = key
        spares = spare_hosts(request.spec)
        if spares:
            handle["spares"] = spares
        return handle

    def restart_in_place(self, request: LaunchRequest) -> dict[str, Any] | None:
        """A warm attempt in the failed attempt's training job: no CreateTrainingJob. Its agents
        learn of it from the control plane (GET .../next) and restart their worker groups on a
        rendezvous port of its own. None when that training job has ended meanwhile (an instance
        went away, the agents gave up waiting): the attempt is launched as a new training job."""
        previous = request.in_place_of
        assert previous is not None
        name = previous.get("training_job_name")
        status = None
        if name:
            status = self.client.describe_training_job(TrainingJobName=name).get("TrainingJobStatus")
        if status != TrainingJobStatus.IN_PROGRESS:
            log.warning("training job %s is %s: %s is launched anew, not in place", name, status, request.attempt_id)
            return None
        # Hot spares take replaced nodes' slots; a running training job cannot grow: the pool is
        # refilled only by the next relaunch.
        port = in_place_port(request.spec, in_place.restarts_of(previous))
        return in_place.next_handle(previous, request, master_port=port)

    def outcomes_from_agents(self, handle: dict[str, Any]) -> bool:
        """The training job outlives a failed worker group while its agents wait in place, so the
        attempt's outcome is what its agents report (POST .../exit), not the job's status."""
        return bool(handle.get("agents_wait"))

    # --- poll, stop, logs -------------------------------------------------------------------

    def poll(self, handle: dict[str, Any]) -> SageMakerPollResult:
        described = self.client.describe_training_job(TrainingJobName=handle["training_job_name"])
        result = poll_result(described, handle.get("hosts") or [])
        kind = (result.reason or {}).get("kind")
        if handle.get("agents_wait") and result.state == AttemptState.FAILED and kind not in NOT_REUSABLE:
            # Agents that wait in place report a failed worker group and stay (the controller reads
            # their reports: outcomes_from_agents); a container that ended while the attempt still
            # ran lost its instance or its agent: the job cannot go on in place.
            message = f"training job {handle['training_job_name']} ended: {(result.reason or {}).get('message')}"
            lost = {"kind": FailureKind.NODE_LOST, "message": message[:1000]}
            result = dataclasses.replace(result, reason=lost)
        return result

    def stop(self, handle: dict[str, Any]) -> None:
        try:
            self.client.stop_training_job(TrainingJobName=handle["training_job_name"])
        except Exception as exc:
            # Stopping a job that already ended is not an error for Aerie.
            if _error_code(exc) != "ValidationException":
                raise

    def fence(self, handle: dict[str, Any], hosts: list[str]) -> None:
        """StopTrainingJob of the attempt's job: SageMaker owns the instances and stops them its
        way (SIGTERM, SIGKILL after 120 s); a lost instance's writes meanwhile are fenced by the
        store (its attempt's checkpoints are never recorded). Not while a hot spare waits in the
        job to take the lost node's slot: SageMaker cannot stop one instance, so the store alone
        fences it, and its agent, if it comes back, is told it is left out and exits."""
        if handle.get("spares"):
            log.warning(
                "%s lost in %s: not stopped, a hot spare may take its place", hosts, handle["training_job_name"]
            )
            return
        self.stop(handle)

    def logs(
        self, handle: dict[str, Any], offsets: dict[str, int] | None = None, max_bytes: int = 1 << 20
    ) -> dict[str, dict[str, Any]]:
        """Per host (algo-N): new lines of its CloudWatch stream. Offsets count events read."""
        job = handle["training_job_name"]
        streams = self.logs_client.describe_log_streams(logGroupName=LOG_GROUP, logStreamNamePrefix=job + "/")
        out: dict[str, dict[str, Any]] = {}
        for stream in streams.get("logStreams", []):
            name = stream["logStreamName"]
            host = name[len(job) + 1 :].rsplit("-", 1)[0]  # "<job>/algo-1-1700000000" -> "algo-1"
            start = max(int((offsets or {}).get(host, 0)), 0)
            text, taken = self._read_stream(name, start, max_bytes)
            out[host] = {"text": text, "offset": start + taken}
        return out

    def _read_stream(self, stream: str, start: int, max_bytes: int) -> tuple[str, int]:
        """Events `start`.. of one stream, paging with CloudWatch's forward token, up to max_bytes."""
        parts: list[str] = []
        size = index = taken = 0
        token = None
        while size < max_bytes:
            kwargs: dict[str, Any] = {
                "logGroupName": LOG_GROUP,
                "logStreamName": stream,
                "startFromHead": True,
                "limit": 10000,
            }
            if token:
                kwargs["nextToken"] = token
            page = self.logs_client.get_log_events(**kwargs)
            for e in page.get("events", []):
                if index >= start:
                    line = e["message"].rstrip("\n") + "\n"
                    if size + len(line) > max_bytes and taken:
                        return "".join(parts), taken
                    parts.append(line)
                    size += len(line)
                    taken += 1
                index += 1
            # CloudWatch hands back the same token once the stream's end is reached.
            if not page.get("events") or page.get("nextForwardToken") in (None, token):
                break
            token = page["nextForwardToken"]
        return "".join(parts), taken


# --- helpers -------------------------------------------------------------------------------------


def _error_code(exc: Exception) -> str | None:
    response = getattr(exc, "response", None)
    return (response or {}).get("Error", {}).get("Code") if isinstance(response, dict) else None


def _region() -> str | None:
    try:
        import boto3

        region = boto3.session.Session().region_name
    except Exception:
        region = None
    return region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or None


def _credentials() -> Any:
    try:
        import boto3

        return boto3.session.Session().get_credentials()
    except Exception:
        return None


def _csv(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]
