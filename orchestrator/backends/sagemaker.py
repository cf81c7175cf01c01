"""The `sagemaker` backend: one SageMaker training job per launched attempt, through boto3.

An in-place attempt (issue #22) creates no training job: the failed attempt's agents are still up
inside its running job (`AERIE_IN_PLACE_WAIT_S`) and restart their worker groups for it, told so by
the control plane (GET .../next). Its handle names the same training job, with the attempt's id
and a rendezvous port of its own; while the job runs on, the attempt's outcome is what its agents
report (`outcomes_from_agents`). The training job ends when the Aerie job does (the agents exit),
on a relaunch (StopTrainingJob, then a new job), or when an instance is lost; an in-place attempt
whose training job has ended meanwhile is launched as a new one.

Launch sends `CreateTrainingJob` built from `sagemaker_mapping.request_from_spec`, with an
attempt-unique `TrainingJobName`, Aerie's environment (API URL, agent token, attempt, resume
point, checkpoint URI) and `aerie:*` tags that let SageMaker's own events be traced back to the
attempt. Inside the container the image's agent (`python -m agent.entrypoint`) runs the user's
entrypoint, exactly as on the local and Slurm backends, and reports to the control plane.
Poll maps `DescribeTrainingJob` onto Aerie's states, keeping `SecondaryStatusTransitions`; stop is
`StopTrainingJob`; logs come from CloudWatch Logs (`/aws/sagemaker/TrainingJobs`, one stream per
instance, `<job>/algo-N-<epoch>`). `event_from_sagemaker` turns SageMaker's EventBridge
"SageMaker Training Job State Change" into Aerie's "Aerie Attempt State Change", so chaining reacts
to either the same way.

Hot spares (`resources.spare_nodes`, issue #23) are extra instances of the training job
(`InstanceCount` = nodes + spares): `AERIE_SPARE_HOSTS` names them (`algo-N+1..`) on every
instance, their agents wait for a failed node's rank slot, and an in-place attempt's handle swaps
them in. A running training job cannot grow, so a used spare comes back only with a relaunch.

Over 400 lines on purpose: one Backend (launch anew or in place, poll, stop, fence, logs) beside
the one request it sends, which must stay together.

AWS cannot be reached from this project's machines: the tests drive this module through
botocore's `Stubber`, which checks every request against the real SageMaker and CloudWatch Logs
service models.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from dataclasses import dataclass
from typing import Any

from aerie_contracts import env as aerie_env
from aerie_contracts import memckpt
from aerie_contracts.failures import STOP_LIMITS, FailureKind
from aerie_contracts.restarts import NOT_REUSABLE
from aerie_contracts.sagemaker_api import TrainingJobStatus
from aerie_contracts.states import AttemptState

# The state and event mapping lives with the handlers (it must ship to AWS Lambda alone).
from lambdas.sagemaker_events import (  # noqa: F401 - event_from_sagemaker re-exported for callers
    _epoch,
    attempt_state,
    event_from_sagemaker,
    failure_reason,
    transitions,
)
from orchestrator.backends import in_place
from orchestrator.backends.base import Backend, LaunchRequest, NodeStatus, PollResult
from orchestrator.backends.nodeenv import (
    attempt_env,
    checkpoint_marker_env,
    in_place_env,
    in_place_on,
    log_metrics_env,
    memory_attempt_env,
    sagemaker_sync_uri,
)
from orchestrator.sagemaker_mapping import request_from_spec
from recovery.modes import memory_tier_off

log = logging.getLogger("aerie.sagemaker")

LOG_GROUP = "/aws/sagemaker/TrainingJobs"
NAME_MAX = 63
# The Aerie image's entrypoint: PID 1 wrapper -> agent -> the user's entrypoint (AERIE_ENTRYPOINT).
AGENT_ENTRYPOINT = ["python", "-m", "agent.entrypoint"]
ENV_VALUE_MAX = 512  # SageMaker's limit on one Environment value
IN_PLACE_WAIT_S = 120.0  # SageMakerBackend.in_place_wait_s


@dataclass(frozen=True)
class SageMakerPollResult(PollResult):
    """A PollResult that also carries SageMaker's own step history, for the controller to emit."""

    transitions: tuple[dict[str, Any], ...] = ()
    secondary_status: str | None = None


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
        if request.in_place_of is not None:
            handle = self._in_place(request)
            if handle is not None:
                return handle
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

    def _in_place(self, request: LaunchRequest) -> dict[str, Any] | None:
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


# --- the request ---------------------------------------------------------------------------------


def training_job_name(request: LaunchRequest) -> str:
    """`<job id>-a<N>`: unique per attempt (SageMaker names are unique per account and region)."""
    suffix = f"-a{request.attempt_number}"
    return request.job_id[: NAME_MAX - len(suffix)].rstrip("-") + suffix


def spare_hosts(spec: Any) -> list[str]:
    """The training job's hot spares (`resources.spare_nodes`): extra instances after the attempt's
    own (`algo-N+1..`), whose agents wait for a failed node's rank slot (AERIE_SPARE_HOSTS). None
    without in-place restarts: there would be no way to hand one a slot."""
    if not in_place_on(spec):
        return []
    count = spec.resources.instance_count
    return [f"algo-{count + i + 1}" for i in range(spec.resources.spare_nodes)]


def in_place_port(spec: Any, restarts: int) -> int:
    """The rendezvous port of the training job's `restarts`-th in-place attempt: the job's own
    (`backend_options.master_port`, else the agents' default) moved up by `restarts`, so that a
    new worker group never joins a store the last group's rank 0 may still serve."""
    base = int((spec.backend_options or {}).get("master_port") or aerie_env.DEFAULT_MASTER_PORT)
    return in_place.rendezvous_port(base, restarts)


def create_training_job_request(
    request: LaunchRequest,
    defaults: dict[str, Any] | None = None,
    in_place_wait_s: float = IN_PLACE_WAIT_S,
    *,
    memory_key: str | None = None,
) -> dict[str, Any]:
    """The CreateTrainingJob request of one attempt (whose agents, where the job may restart in
    place, wait `in_place_wait_s` after a failed worker group: `in_place_env`; with `memory_key`,
    they run the in-memory checkpoint tier with it)."""
    spec = request.spec
    options = dict(spec.backend_options or {})
    carried = {**(defaults or {}), **(options.get("sagemaker") or {})}
    agent_entrypoint = list(options.get("agent_entrypoint") or AGENT_ENTRYPOINT)
    workdir = options.get("container_workdir") or "/opt/ml/code"
    body = request_from_spec(spec.model_copy(update={"backend_options": {**options, "sagemaker": carried}}))
    body["TrainingJobName"] = training_job_name(request)
    # No RetryStrategy: Aerie chains attempts itself (in place inside this training job, or a new
    # one resumed from the last good checkpoint, bad nodes excluded); SageMaker's own retries would hide failures
    # from chaining and restart without the resume point.
    body.pop("RetryStrategy", None)
    # The image's agent runs the user's entrypoint (AERIE_ENTRYPOINT), as on every backend.
    algo = body["AlgorithmSpecification"]
    algo["ContainerEntrypoint"] = agent_entrypoint
    algo.pop("ContainerArguments", None)
    # Aerie's checkpoints (AERIE_CHECKPOINT_URI = <s3_uri>/<job id>, shared by every attempt) stream
    # to and from S3 and never go through CheckpointConfig, which would have SageMaker copy all of
    # them to /opt/ml/checkpoints at every start. SageMaker's sync only if the spec asks, elsewhere.
    sync_uri = sagemaker_sync_uri(spec, request.job_id)
    if "CheckpointConfig" in body and sync_uri:
        body["CheckpointConfig"]["S3Uri"] = sync_uri
    aerie = attempt_env(request, workdir)
    aerie.pop("TRAINING_JOB_NAME")  # SageMaker sets it in the container itself
    # No rendezvous address: each node reads it from resourceconfig.json (the first sorted host,
    # by name); the port is fixed (agent.identity's default) unless the spec names one.
    if options.get("master_port"):
        aerie[aerie_env.MASTER_PORT] = str(options["master_port"])
    # Only the health fields the spec changed: the whole section nears SageMaker's 512-character cap
    # on one Environment value, and the agent fills the rest with the same defaults (tested).
    aerie[aerie_env.HEALTH] = spec.health.model_dump_json(exclude_defaults=True)
    aerie.update(log_metrics_env(spec))
    aerie.update(checkpoint_marker_env(spec))
    aerie.update(in_place_env(spec, in_place_wait_s))
    if memory_key:
        aerie.update(memory_attempt_env(spec, memory_key))
    spares = spare_hosts(spec)
    if spares:
        body["ResourceConfig"]["InstanceCount"] = spec.resources.instance_count + len(spares)
        aerie[aerie_env.SPARE_HOSTS] = ",".join(spares)
    environment = {**body.get("Environment", {}), **request.extra_env, **aerie}
    too_long = sorted(k for k, v in environment.items() if len(v) > ENV_VALUE_MAX)
    if too_long:
        raise ValueError(
            f"SageMaker limits Environment values to {ENV_VALUE_MAX} characters; too long: "
            f"{too_long} (move long entrypoint arguments into hyperparameters)"
        )
    body["Environment"] = environment
    tags = [t for t in body.get("Tags", []) if not t["Key"].startswith("aerie:")]
    tags += [
        {"Key": "aerie:job", "Value": request.job_id},
        {"Key": "aerie:job-name", "Value": request.job_name},
        {"Key": "aerie:attempt", "Value": request.attempt_id},
    ]
    body["Tags"] = tags
    return body


# --- state ---------------------------------------------------------------------------------------


def poll_result(described: dict[str, Any], hosts: list[str]) -> SageMakerPollResult:
    """One DescribeTrainingJob answer as the attempt's PollResult."""
    status = described["TrainingJobStatus"]
    secondary = described.get("SecondaryStatus")
    state = attempt_state(status, secondary)
    reason, code = (None, None)
    if state == AttemptState.FAILED:
        reason, code = failure_reason(described.get("FailureReason"))
        code = code if code is not None else 1
    elif state == AttemptState.COMPLETED:
        code = 0
    elif state == AttemptState.STOPPED:
        # SageMaker stopped it for its StoppingCondition (MaxRuntimeExceeded, MaxWaitTimeExceeded):
        # the job ends Stopped with that reason, as the control plane's own enforcement ends it.
        limit = next((v for v in STOP_LIMITS.values() if v.secondary_status == secondary), None)
        reason = {"kind": limit.kind.value, "message": limit.message} if limit else None
    ended = _epoch(described.get("TrainingEndTime"))
    ended_code = code if state in (AttemptState.COMPLETED, AttemptState.FAILED) else None
    nodes = tuple(NodeStatus(h, state, ended_code, reason, ended) for h in hosts)
    # Before "Training" SageMaker is still provisioning instances and pulling the image.
    queued = state == AttemptState.STARTING
    return SageMakerPollResult(state, nodes, reason, code, transitions(described), secondary, queued=queued)


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
