"""SageMaker's training-job operations on Aerie's jobs.

CreateTrainingJob makes an ordinary Aerie job (the controller, the agents, chaining and the
dashboard treat it like any other) plus a record of the request as sent; the other operations
read and change that pair, always within the caller's tenant and region. What a request means
on a backend comes from `orchestrator/sagemaker_api/admission.py`, every answer's shape from
`orchestrator/sagemaker_answers.py`.
"""

from __future__ import annotations

import base64
import json
import re
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from aerie_contracts import sagemaker_api as contract
from aerie_contracts.states import JOB_TERMINAL
from orchestrator import sagemaker_answers as answers
from orchestrator.sagemaker_api import admission, shapes
from orchestrator.sagemaker_api.call import Call, registry
from orchestrator.sagemaker_api.errors import (
    RESOURCE_IN_USE,
    RESOURCE_LIMIT_EXCEEDED,
    RESOURCE_NOT_FOUND,
    AwsError,
    not_found,
    validation,
)
from orchestrator.spec import NAME_PATTERN, JobSpec
from orchestrator.store import repo

OPERATIONS, operation = registry()
_NAME = re.compile(NAME_PATTERN)
MAX_TAGS = 50
LOG_SCAN_BYTES = 1 << 20  # FinalMetricDataList: the regexes run over each node's last MiB of output


# --- helpers ---------------------------------------------------------------------------------------


def _name(body: dict[str, Any]) -> str:
    name = body.get("TrainingJobName")
    if not isinstance(name, str) or not _NAME.match(name):
        raise validation(
            f"1 validation error detected: Value '{name}' at 'trainingJobName' failed to satisfy constraint: "
            f"Member must satisfy regular expression pattern: {NAME_PATTERN}"
        )
    return name


def _record(call: Call, name: str):
    try:
        return repo.get_sagemaker_job(
            call.session, call.who.tenant, answers.training_job_arn(call.region, call.who.tenant, name)
        )
    except repo.NotFound:
        raise not_found() from None


def _record_by_arn(call: Call, arn: Any):
    if not isinstance(arn, str) or not arn.startswith("arn:"):
        raise validation(f"1 validation error detected: Value '{arn}' at 'resourceArn' is not an ARN")
    try:
        return repo.get_sagemaker_job(call.session, call.who.tenant, arn)
    except repo.NotFound:
        raise AwsError(RESOURCE_NOT_FOUND, f"Resource {arn} does not exist (or is not a training job).") from None


def _tags(value: Any) -> list[dict[str, str]]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(
        isinstance(t, dict) and isinstance(t.get("Key"), str) and isinstance(t.get("Value", ""), str) for t in value
    ):
        raise validation("Tags must be a list of {Key, Value} strings")
    if len(value) > MAX_TAGS:
        raise validation(f"A resource can have at most {MAX_TAGS} tags, got {len(value)}")
    return [{"Key": t["Key"], "Value": t.get("Value", "")} for t in value]


def _time(value: Any, field: str) -> float | None:
    """A JSON 1.1 timestamp: epoch seconds (what botocore sends) or an ISO 8601 string."""
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        try:
            return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
        except ValueError:
            pass
    raise validation(f"{field}: not a timestamp: {value!r}")


def _page(token: Any) -> int:
    if token is None:
        return 0
    try:
        offset = int(json.loads(base64.urlsafe_b64decode(str(token).encode()))["offset"])
    except (ValueError, KeyError, TypeError):
        raise validation("Invalid pagination token (NextToken).") from None
    if offset < 0:
        raise validation("Invalid pagination token (NextToken).")
    return offset


def _next_token(offset: int) -> str:
    return base64.urlsafe_b64encode(json.dumps({"offset": offset}).encode()).decode()


# Pydantic's range and pattern errors in AWS's words for the same constraints.
_AWS_RULES = {
    "greater_than_equal": "Member must have value greater than or equal to {ge}",
    "less_than_equal": "Member must have value less than or equal to {le}",
    "string_pattern_mismatch": "Member must satisfy regular expression pattern: {pattern}",
}


def _spec_error(exc: ValidationError, request: dict[str, Any]) -> AwsError:
    """The spec's validation errors as AWS's, each at the request field it comes from (AWS's path:
    `resourceConfig.instanceCount`, never the spec's `resources.instance_count`)."""
    lines = []
    for e in exc.errors():
        loc = tuple(e["loc"])
        path = admission.request_field(loc, request)
        template = _AWS_RULES.get(e["type"])
        rule = template.format(**e.get("ctx", {})) if template else str(e["msg"]).removeprefix("Value error, ")
        value = e.get("input")
        if loc[:1] == ("health",) and len(loc) > 1:  # the aerie:health tag's JSON: name the threshold
            rule, value = f"{'.'.join(map(str, loc[1:]))}: {rule}", None
        if not path:
            lines.append(rule)
            continue
        shown = f" '{value}'" if isinstance(value, (str, int, float)) and not isinstance(value, bool) else ""
        lines.append(f"Value{shown} at '{path}' failed to satisfy constraint: {rule}")
    return shapes.detected(lines)


def final_metrics(call: Call, record, job) -> list[dict[str, Any]]:
    """FinalMetricDataList: the request's MetricDefinitions run over the latest attempt's output."""
    definitions = (record.request.get("AlgorithmSpecification") or {}).get("MetricDefinitions") or []
    attempts = [a for a in job.attempts if a.handle]
    backend = call.backends.get(job.backend)
    if not definitions or not attempts or backend is None:
        return []
    latest = attempts[-1]
    hosts = latest.handle.get("hosts") or []
    try:
        chunks = backend.logs(latest.handle, {h: -LOG_SCAN_BYTES for h in hosts}, max_bytes=LOG_SCAN_BYTES)
    except Exception:  # logs of a backend that is unreachable now: no metrics, not a failed describe
        return []
    text = "\n".join(chunks[h]["text"] for h in hosts if h in chunks)
    return answers.metric_values(definitions, text, latest.ended_at or call.now)


# --- operations ------------------------------------------------------------------------------------


@operation("CreateTrainingJob", writes=True)
def create_training_job(call: Call, body: dict[str, Any]) -> dict[str, Any]:
    # Every enum-typed field against botocore's model of the operation, before anything is looked
    # up or stored: what AWS refuses is refused here too, in AWS's words.
    shapes.check_enums("sagemaker", "CreateTrainingJob", body)
    name = _name(body)
    if not isinstance(body.get("AlgorithmSpecification"), dict):
        raise validation(
            "1 validation error detected: Value null at 'algorithmSpecification' failed to satisfy constraint: "
            "Member must not be null"
        )
    tags = _tags(body.get("Tags"))
    tag_map = {t["Key"]: t["Value"] for t in tags}
    backend = tag_map.get(contract.BACKEND_TAG) or call.settings.default_backend
    if backend not in call.backends:
        raise AwsError(
            RESOURCE_NOT_FOUND,
            f"Backend {backend!r} (tag {contract.BACKEND_TAG}) is not configured on this Aerie control plane; "
            f"configured: {', '.join(sorted(call.backends))}",
        )
    try:
        warnings = admission.backend_limits(body, backend)
        spec = JobSpec.model_validate(admission.endpoint_spec(body, backend))
    except admission.Unsupported as exc:
        raise validation(f"1 validation error detected: {exc} (backend {backend})") from None
    except ValidationError as exc:
        raise _spec_error(exc, body) from None
    arn = answers.training_job_arn(call.region, call.who.tenant, name)
    in_use_message = (
        "Training job names must be unique within an AWS account and region, and a training job with this "
        f"name already exists ({arn})"
    )
    s = call.session
    limit = call.settings.max_instances
    if limit:
        in_use = repo.sagemaker_instances_in_use(s, call.who.tenant)
        delta = spec.resources.instance_count
        if in_use + delta > limit:
            raise AwsError(
                RESOURCE_LIMIT_EXCEEDED,
                f"The account-level service limit 'Number of instances across all training jobs' is {limit} "
                f"Instances, with current utilization of {in_use} Instances and a request delta of {delta} "
                "Instances. Ask the Aerie operator to raise AERIE_SAGEMAKER_MAX_INSTANCES.",
            )
    try:
        repo.create_sagemaker_job(
            s,
            spec.model_dump(mode="json"),
            call.who.tenant,
            arn=arn,
            region=call.region,
            request=body,
            tags=tags,
            warnings=warnings,
        )
    except repo.NameInUse:
        raise AwsError(RESOURCE_IN_USE, in_use_message) from None
    return {"TrainingJobArn": arn}


@operation("DescribeTrainingJob")
def describe_training_job(call: Call, body: dict[str, Any]) -> dict[str, Any]:
    record = _record(call, _name(body))
    job = record.job
    return answers.describe_training_job(record, job, call.now, final_metrics(call, record, job))


@operation("StopTrainingJob", writes=True)
def stop_training_job(call: Call, body: dict[str, Any]) -> dict[str, Any]:
    record = _record(call, _name(body))
    job = record.job
    if job.state in JOB_TERMINAL:
        raise validation(
            f"The request was rejected because the training job is in status {answers.training_job_status(job)}."
        )
    job.stop_requested = True  # the controller stops the running attempt, as for `aerie stop`
    return {}


@operation("ListTrainingJobs")
def list_training_jobs(call: Call, body: dict[str, Any]) -> dict[str, Any]:
    limit = body.get("MaxResults", 10)
    if not isinstance(limit, int) or not 1 <= limit <= 100:
        raise validation("MaxResults must be between 1 and 100")
    offset = _page(body.get("NextToken"))
    sort_by = body.get("SortBy", "CreationTime")
    order = body.get("SortOrder", "Ascending")
    if sort_by not in ("Name", "CreationTime", "Status") or order not in ("Ascending", "Descending"):
        raise validation("SortBy must be Name, CreationTime or Status; SortOrder Ascending or Descending")
    states, stopping = None, None
    if body.get("StatusEquals") is not None:
        if body["StatusEquals"] not in answers.STATES_OF_STATUS:
            raise validation(f"StatusEquals {body['StatusEquals']!r} is not a TrainingJobStatus")
        states, stopping = answers.STATES_OF_STATUS[body["StatusEquals"]]
    if body.get("WarmPoolStatusEquals") or body.get("TrainingPlanArnEquals"):
        return {"TrainingJobSummaries": []}  # Aerie keeps no warm pools and has no training plans
    records = repo.list_sagemaker_jobs(
        call.session,
        call.who.tenant,
        call.region,
        name_contains=body.get("NameContains"),
        states=states,
        stop_requested=stopping,
        created_after=_time(body.get("CreationTimeAfter"), "CreationTimeAfter"),
        created_before=_time(body.get("CreationTimeBefore"), "CreationTimeBefore"),
        modified_after=_time(body.get("LastModifiedTimeAfter"), "LastModifiedTimeAfter"),
        modified_before=_time(body.get("LastModifiedTimeBefore"), "LastModifiedTimeBefore"),
        sort_by=sort_by,
        descending=order == "Descending",
        limit=limit + 1,
        offset=offset,
    )
    out: dict[str, Any] = {
        "TrainingJobSummaries": [answers.training_job_summary(r, r.job, call.now) for r in records[:limit]]
    }
    if len(records) > limit:
        out["NextToken"] = _next_token(offset + limit)
    return out


@operation("AddTags", writes=True)
def add_tags(call: Call, body: dict[str, Any]) -> dict[str, Any]:
    record = _record_by_arn(call, body.get("ResourceArn"))
    new = _tags(body.get("Tags"))
    merged = {t["Key"]: t["Value"] for t in record.tags or []}
    merged.update({t["Key"]: t["Value"] for t in new})
    if len(merged) > MAX_TAGS:
        raise validation(f"A resource can have at most {MAX_TAGS} tags; this would make {len(merged)}")
    record.tags = [{"Key": k, "Value": v} for k, v in merged.items()]
    return {"Tags": new}


@operation("ListTags")
def list_tags(call: Call, body: dict[str, Any]) -> dict[str, Any]:
    record = _record_by_arn(call, body.get("ResourceArn"))
    limit = body.get("MaxResults", 50)
    if not isinstance(limit, int) or limit < 50:
        raise validation("MaxResults must be at least 50")
    offset = _page(body.get("NextToken"))
    tags = list(record.tags or [])
    out: dict[str, Any] = {"Tags": tags[offset : offset + limit]}
    if offset + limit < len(tags):
        out["NextToken"] = _next_token(offset + limit)
    return out


@operation("DeleteTags", writes=True)
def delete_tags(call: Call, body: dict[str, Any]) -> dict[str, Any]:
    record = _record_by_arn(call, body.get("ResourceArn"))
    keys = body.get("TagKeys")
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
        raise validation("TagKeys must be a list of strings")
    record.tags = [t for t in record.tags or [] if t["Key"] not in set(keys)]
    return {}
