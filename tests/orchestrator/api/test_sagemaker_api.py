"""The SageMaker-compatible endpoint's protocol, operations and errors, spoken by real boto3 clients.

The API runs in-process (no controller: jobs stay where the test puts them) behind a real HTTP
server, and boto3 signs with credentials from `POST /v1/tokens {"aws": true}`. Botocore parses
every answer with SageMaker's own service model, so a wrong shape fails here as it would in a
user's launcher. Running jobs end to end is tests/e2e/test_sagemaker_endpoint.py's part.
"""

from __future__ import annotations

import json
import time
import uuid
from types import SimpleNamespace

import boto3
import httpx
import pytest
from botocore.exceptions import ClientError

from orchestrator.backends.sagemaker import SageMakerBackend
from orchestrator.sagemaker_api.call import EndpointSettings
from orchestrator.store import repo
from tests.helpers.sagemaker import ROLE, attempt_with_logs, aws_keys, client, request, served_api_fixture

# Every request field CreateTrainingJob takes that Aerie stores, in one "held-out style" request:
# spot, VPC, KMS, FastFile, retry, checkpoint, metric definitions, tags, environment and the rest.
FULL_REQUEST = {
    "TrainingJobName": "full-request-1",
    "HyperParameters": {"steps": "20", "lr": "0.0006", "seq_len": "64"},
    "AlgorithmSpecification": {
        "TrainingImage": "123456789012.dkr.ecr.us-east-1.amazonaws.com/aerie-trainer:2026.11",
        "TrainingInputMode": "FastFile",
        "ContainerEntrypoint": ["python", "-m", "trainer.train"],
        "ContainerArguments": ["--config", "examples/configs/pythia-tiny.yaml"],
        "MetricDefinitions": [
            {"Name": "train:loss", "Regex": "loss ([0-9.]+)"},
            {"Name": "train:tokens_per_s", "Regex": "([0-9,]+) tokens/s"},
        ],
        "EnableSageMakerMetricsTimeSeries": True,
    },
    "RoleArn": ROLE,
    "InputDataConfig": [
        {
            "ChannelName": "train",
            "DataSource": {
                "S3DataSource": {
                    "S3DataType": "S3Prefix",
                    "S3Uri": "s3://aerie-data/pile/train/",
                    "S3DataDistributionType": "FullyReplicated",
                }
            },
            "InputMode": "FastFile",
            "CompressionType": "None",
        }
    ],
    "OutputDataConfig": {
        "S3OutputPath": "s3://aerie-output/pythia/",
        "KmsKeyId": "arn:aws:kms:us-east-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab",
    },
    "ResourceConfig": {
        "InstanceType": "ml.p4d.24xlarge",
        "InstanceCount": 2,
        "VolumeSizeInGB": 200,
        "VolumeKmsKeyId": "arn:aws:kms:us-east-1:123456789012:key/abcd1234-12ab-34cd-56ef-1234567890ab",
        "KeepAlivePeriodInSeconds": 600,
    },
    "VpcConfig": {"SecurityGroupIds": ["sg-0123456789abcdef0"], "Subnets": ["subnet-0123456789abcdef0"]},
    "StoppingCondition": {"MaxRuntimeInSeconds": 432000, "MaxWaitTimeInSeconds": 864000},
    "Tags": [{"Key": "team", "Value": "pretraining"}, {"Key": "cost-center", "Value": "llm"}],
    "EnableNetworkIsolation": True,
    "EnableInterContainerTrafficEncryption": True,
    "EnableManagedSpotTraining": True,
    "CheckpointConfig": {"S3Uri": "s3://aerie-checkpoints/pythia/", "LocalPath": "/opt/ml/checkpoints"},
    "DebugHookConfig": {"S3OutputPath": "s3://aerie-output/debug/"},
    "TensorBoardOutputConfig": {"S3OutputPath": "s3://aerie-output/tb/", "LocalPath": "/opt/ml/output/tensorboard"},
    "ExperimentConfig": {"ExperimentName": "pythia", "TrialName": "t1"},
    "ProfilerConfig": {"DisableProfiler": True},
    "Environment": {"NCCL_DEBUG": "WARN", "FI_PROVIDER": "efa"},
    "RetryStrategy": {"MaximumRetryAttempts": 3},
}
# What the local backend cannot apply of FULL_REQUEST: each must be named where users see it.
UNHONOURED = [
    "InputMode: FastFile is not a mount here",
    "AlgorithmSpecification.TrainingImage",
    "AlgorithmSpecification.EnableSageMakerMetricsTimeSeries",
    "ResourceConfig.InstanceType",
    "ResourceConfig.VolumeKmsKeyId",
    "ResourceConfig.KeepAlivePeriodInSeconds",
    "OutputDataConfig.KmsKeyId",
    "VpcConfig",
    "EnableNetworkIsolation",
    "EnableInterContainerTrafficEncryption",
    "EnableManagedSpotTraining",
    "CheckpointConfig.S3Uri",
    "DebugHookConfig",
    "TensorBoardOutputConfig",
    "ExperimentConfig",
    "ProfilerConfig",
]


server = served_api_fixture("sagemaker-api")


@pytest.fixture
def endpoint(server):
    app = server.app
    saved = (app.state.sagemaker, dict(app.state.backends))
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    keys = aws_keys(server.url, server.admin, role="member", tenant=tenant)
    yield SimpleNamespace(
        url=server.url, app=app, admin=server.admin, tenant=tenant, keys=keys, sm=client("sagemaker", server.url, keys)
    )
    app.state.sagemaker, app.state.backends = saved[0], saved[1]


def _error(exc: ClientError) -> tuple[str, str]:
    meta = exc.response["ResponseMetadata"]["HTTPHeaders"]
    assert meta["x-amzn-errortype"] == exc.response["Error"]["Code"]  # header and body agree
    assert meta["content-type"] == "application/x-amz-json-1.1"
    return exc.response["Error"]["Code"], exc.response["Error"]["Message"]


def _job(endpoint, name: str):
    with endpoint.app.state.db.session() as s:
        return repo.get_job(s, endpoint.tenant, name)


def _set_state(endpoint, name: str, state: str, stop: bool = False) -> None:
    with endpoint.app.state.db.session() as s:
        job = repo.get_job(s, endpoint.tenant, name)
        if stop:
            job.stop_requested = True
        else:
            repo.set_job_state(s, job, state)


# --- acceptance 2: a full request round-trips ------------------------------------------------------


def test_a_full_create_training_job_request_round_trips_through_describe(endpoint):
    sm = endpoint.sm
    arn = sm.create_training_job(**FULL_REQUEST)["TrainingJobArn"]
    assert arn.startswith("arn:aws:sagemaker:us-east-1:") and arn.endswith(":training-job/full-request-1")
    d = sm.describe_training_job(TrainingJobName="full-request-1")
    # Every field given comes back as given (Tags are ListTags' to return, as on SageMaker).
    for key, value in FULL_REQUEST.items():
        if key == "Tags":
            continue
        assert key in d, f"{key} was dropped"
        assert json.loads(json.dumps(d[key], default=str)) == value, key
    assert sm.list_tags(ResourceArn=arn)["Tags"] == FULL_REQUEST["Tags"]
    assert d["TrainingJobArn"] == arn and d["TrainingJobStatus"] == "InProgress"
    assert d["SecondaryStatus"] == "Starting"
    assert d["ModelArtifacts"]["S3ModelArtifacts"] == "s3://aerie-output/pythia/full-request-1/output/model.tar.gz"
    # What the local backend cannot apply is named in the first transition, never silently dropped.
    message = d["SecondaryStatusTransitions"][0]["StatusMessage"]
    for field in UNHONOURED:
        assert field in message, f"{field} is not reported: {message}"
    assert "StoppingCondition" not in message  # enforced on every backend (orchestrator/stopping.py)
    # The Aerie job behind it: the request's meaning in Aerie's spec.
    job = _job(endpoint, "full-request-1")
    spec = job.spec
    assert job.backend == "local" and spec["resources"]["instance_count"] == 2
    assert spec["retry"]["max_restarts"] == 3
    assert spec["env"] == FULL_REQUEST["Environment"]
    assert spec["hyperparameters"] == FULL_REQUEST["HyperParameters"]
    assert spec["inputs"] == [
        {
            "channel": "train",
            "s3_uri": "s3://aerie-data/pile/train/",
            "mode": "FastFile",
            "distribution": "FullyReplicated",
        }
    ]
    assert spec["checkpoint"]["s3_uri"] == "s3://aerie-checkpoints/pythia/"
    assert spec["backend_options"]["container_paths"] is True
    assert spec["backend_options"]["model_artifacts_uri"] == d["ModelArtifacts"]["S3ModelArtifacts"]


def test_the_backend_comes_from_the_aerie_backend_tag_or_the_server_default(endpoint):
    sm = endpoint.sm
    endpoint.app.state.backends["sagemaker"] = SageMakerBackend(client=object(), region="us-east-1")
    tags = [{"Key": "aerie:backend", "Value": "sagemaker"}]
    sm.create_training_job(**{**FULL_REQUEST, "TrainingJobName": "on-sagemaker", "Tags": tags})
    assert _job(endpoint, "on-sagemaker").backend == "sagemaker"
    d = sm.describe_training_job(TrainingJobName="on-sagemaker")
    assert "Not honoured" not in d["SecondaryStatusTransitions"][0]["StatusMessage"]  # SageMaker applies all
    endpoint.app.state.sagemaker = EndpointSettings(
        server_key=endpoint.app.state.sagemaker.server_key, default_backend="sagemaker"
    )
    sm.create_training_job(**request("default-backend"))
    assert _job(endpoint, "default-backend").backend == "sagemaker"
    with pytest.raises(sm.exceptions.ResourceNotFound) as err:
        sm.create_training_job(**request("nowhere", Tags=[{"Key": "aerie:backend", "Value": "nope"}]))
    assert "nope" in _error(err.value)[1]


# --- errors as botocore expects them ----------------------------------------------------------------


def test_sagemakers_errors_raise_botocores_exception_classes(endpoint):
    sm = endpoint.sm
    sm.create_training_job(**request("dup"))
    with pytest.raises(sm.exceptions.ResourceInUse) as err:
        sm.create_training_job(**request("DUP"))  # names are unique case-insensitively (ARNs lower-case them)
    assert "already exists" in _error(err.value)[1]
    with pytest.raises(ClientError) as err:
        sm.describe_training_job(TrainingJobName="never-created")
    assert _error(err.value) == ("ValidationException", "Requested resource not found.")  # as SageMaker says it
    with pytest.raises(ClientError) as err:
        sm.create_training_job(**request("bad_name!"))
    code, message = _error(err.value)
    assert code == "ValidationException" and "trainingJobName" in message
    with pytest.raises(ClientError) as err:
        sm.create_training_job(**request("too-many", HyperParameters={f"h{i}": "1" for i in range(101)}))
    code, message = _error(err.value)
    assert code == "ValidationException" and "hyperParameters" in message and "100" in message
    pipe = request("piped", InputDataConfig=[_channel("s3://b/p", InputMode="Pipe")])
    with pytest.raises(ClientError) as err:
        sm.create_training_job(**pipe)
    assert _error(err.value)[0] == "ValidationException" and "Pipe" in _error(err.value)[1]
    # A 2.x framework estimator's request: the image's toolkit would run `sagemaker_program`.
    framework = request("framework", HyperParameters={"sagemaker_program": "train.py"})
    framework["AlgorithmSpecification"] = {"TrainingImage": "pytorch-training:2.5", "TrainingInputMode": "File"}
    with pytest.raises(ClientError) as err:
        sm.create_training_job(**framework)
    code, message = _error(err.value)
    assert code == "ValidationException" and "ContainerEntrypoint" in message and "sagemaker-training" in message
    _set_state(endpoint, "dup", "Completed")
    with pytest.raises(ClientError) as err:
        sm.stop_training_job(TrainingJobName="dup")
    assert _error(err.value) == (
        "ValidationException",
        "The request was rejected because the training job is in status Completed.",
    )
    # Nothing was half-made by the refused requests.
    names = [j["TrainingJobName"] for j in sm.list_training_jobs()["TrainingJobSummaries"]]
    assert names == ["dup"]


def test_the_instance_quota_is_resource_limit_exceeded(endpoint):
    sm = endpoint.sm
    endpoint.app.state.sagemaker = EndpointSettings(server_key=endpoint.app.state.sagemaker.server_key, max_instances=3)
    two = {"InstanceType": "ml.c5.xlarge", "InstanceCount": 2, "VolumeSizeInGB": 10}
    sm.create_training_job(**request("first", ResourceConfig=two))
    with pytest.raises(sm.exceptions.ResourceLimitExceeded) as err:
        sm.create_training_job(**request("second", ResourceConfig=two))
    assert "current utilization of 2 Instances and a request delta of 2" in _error(err.value)[1]
    _set_state(endpoint, "first", "Completed")  # ended jobs hold no instances
    sm.create_training_job(**request("second", ResourceConfig=two))


def _signed_headers(endpoint, target: str, body: bytes, service: str = "sagemaker") -> dict:
    """Headers of a request signed by botocore's SigV4 signer, as any AWS SDK signs it."""
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    req = AWSRequest(
        method="POST",
        url=endpoint.url + "/",
        data=body,
        headers={"X-Amz-Target": target, "Content-Type": "application/x-amz-json-1.1"},
    )
    SigV4Auth(Credentials(*endpoint.keys), service, "us-east-1").add_auth(req)
    return dict(req.headers.items())


def _signed(endpoint, target: str, body: bytes, service: str = "sagemaker") -> httpx.Response:
    return httpx.post(endpoint.url + "/", content=body, headers=_signed_headers(endpoint, target, body, service))


def test_unknown_operations_and_bodies_that_are_not_json(endpoint):
    r = _signed(endpoint, "SageMaker.DeleteEverything", b"{}")
    assert r.status_code == 400 and r.json()["__type"] == "UnknownOperationException"
    r = _signed(endpoint, "DynamoDB_20120810.ListTables", b"{}")
    assert r.status_code == 400 and r.json()["__type"] == "UnknownOperationException"
    r = _signed(endpoint, "SageMaker.ListTrainingJobs", b"{not json")
    assert r.status_code == 400 and r.json()["__type"] == "SerializationException"
    assert r.headers["x-amzn-errortype"] == "SerializationException" and r.headers["x-amzn-requestid"]
    r = _signed(endpoint, "SageMaker.ListTrainingJobs", b"{}")
    assert r.status_code == 200 and r.json() == {"TrainingJobSummaries": []}
    assert r.headers["content-type"] == "application/x-amz-json-1.1"


def test_the_endpoint_shares_the_root_with_the_dashboard_and_the_rest_api(endpoint):
    """POST / with X-Amz-Target is the SageMaker endpoint; GET / still redirects to the dashboard,
    a POST / without the header is not taken, and /v1 and the heartbeat path are untouched."""
    r = httpx.get(endpoint.url + "/", follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/ui/jobs"
    assert httpx.post(endpoint.url + "/", json={}).status_code == 405
    r = httpx.get(endpoint.url + "/v1/jobs", headers={"Authorization": f"Bearer {endpoint.admin}"})
    assert r.status_code == 200
    assert httpx.post(endpoint.url + "/v1/attempts/a/nodes/h/heartbeat", json={}).status_code == 401


# --- ListTrainingJobs, tags ---------------------------------------------------------------------------


def test_list_training_jobs_filters_sorts_and_pages(endpoint):
    sm = endpoint.sm
    names = ["alpha-1", "beta-2", "alpha-3", "gamma-4", "alpha-5"]
    base = int(time.time()) - 1000
    for i, name in enumerate(names):
        sm.create_training_job(**request(name))
        with endpoint.app.state.db.session() as s:  # creation times whole seconds apart
            repo.get_job(s, endpoint.tenant, name).created_at = base + 10 * i
    _set_state(endpoint, "beta-2", "Completed")
    _set_state(endpoint, "gamma-4", "Failed")
    _set_state(endpoint, "alpha-5", "", stop=True)

    def listed(**kwargs) -> list[str]:
        pages = sm.get_paginator("list_training_jobs").paginate(**kwargs)
        return [j["TrainingJobName"] for page in pages for j in page["TrainingJobSummaries"]]

    assert listed() == names  # CreationTime, ascending: SageMaker's defaults
    assert listed(PaginationConfig={"PageSize": 2}) == names  # three pages, nothing lost or repeated
    assert len(sm.list_training_jobs(MaxResults=2)["TrainingJobSummaries"]) == 2
    assert listed(NameContains="ALPHA") == ["alpha-1", "alpha-3", "alpha-5"]
    assert listed(StatusEquals="Completed") == ["beta-2"]
    assert listed(StatusEquals="Failed") == ["gamma-4"]
    assert listed(StatusEquals="Stopping") == ["alpha-5"]
    assert listed(StatusEquals="InProgress") == ["alpha-1", "alpha-3"]
    assert listed(SortBy="Name", SortOrder="Descending") == sorted(names, reverse=True)
    created = {j["TrainingJobName"]: j["CreationTime"] for j in sm.list_training_jobs()["TrainingJobSummaries"]}
    assert listed(CreationTimeAfter=created["alpha-3"]) == ["gamma-4", "alpha-5"]
    assert listed(CreationTimeBefore=created["beta-2"]) == ["alpha-1"]
    assert listed(LastModifiedTimeAfter=time.time() + 60) == []
    summary = {j["TrainingJobName"]: j for j in sm.list_training_jobs()["TrainingJobSummaries"]}
    assert summary["beta-2"]["TrainingJobStatus"] == "Completed" and "TrainingEndTime" in summary["beta-2"]
    assert summary["alpha-5"]["TrainingJobStatus"] == "Stopping" and summary["alpha-5"]["SecondaryStatus"] == "Stopping"
    with pytest.raises(ClientError) as err:
        sm.list_training_jobs(NextToken="not-a-token")
    assert _error(err.value)[0] == "ValidationException"


def test_add_list_and_delete_tags(endpoint):
    sm = endpoint.sm
    arn = sm.create_training_job(**request("tagged", Tags=[{"Key": "a", "Value": "1"}]))["TrainingJobArn"]
    sm.add_tags(ResourceArn=arn, Tags=[{"Key": "b", "Value": "2"}, {"Key": "a", "Value": "3"}])
    assert sm.list_tags(ResourceArn=arn)["Tags"] == [{"Key": "a", "Value": "3"}, {"Key": "b", "Value": "2"}]
    sm.delete_tags(ResourceArn=arn, TagKeys=["a"])
    assert sm.list_tags(ResourceArn=arn)["Tags"] == [{"Key": "b", "Value": "2"}]
    with pytest.raises(ClientError) as err:
        sm.add_tags(ResourceArn=arn, Tags=[{"Key": f"k{i}", "Value": "v"} for i in range(50)])
    assert _error(err.value)[0] == "ValidationException"
    sm.add_tags(ResourceArn=arn, Tags=[{"Key": f"k{i}", "Value": "v"} for i in range(49)])
    pages = list(sm.get_paginator("list_tags").paginate(ResourceArn=arn))
    assert sum(len(p["Tags"]) for p in pages) == 50
    with pytest.raises(sm.exceptions.ResourceNotFound):
        sm.list_tags(ResourceArn=arn.replace("tagged", "untagged"))


# --- SigV4, roles and tenants -----------------------------------------------------------------------


def test_only_correctly_signed_fresh_requests_of_known_keys_get_in(endpoint, monkeypatch):
    from datetime import timedelta

    import botocore.auth
    from botocore import UNSIGNED
    from botocore.config import Config

    url, keys = endpoint.url, endpoint.keys

    def code(sm) -> tuple[str, str]:
        with pytest.raises(ClientError) as err:
            sm.list_training_jobs()
        return _error(err.value)

    assert code(client("sagemaker", url, (keys[0], "x" * 40)))[0] == "InvalidSignatureException"
    assert code(client("sagemaker", url, ("AKIAAAAAAAAAAAAAAAAA", keys[1])))[0] == "UnrecognizedClientException"
    assert code(client("sagemaker", url, ("AKIAMADEUPKEY", keys[1])))[0] == "UnrecognizedClientException"
    unsigned = boto3.client(
        "sagemaker", endpoint_url=url, region_name="us-east-1", config=Config(signature_version=UNSIGNED)
    )
    assert code(unsigned) == ("MissingAuthenticationTokenException", "Missing Authentication Token")
    # A request signed for another service does not count for this one.
    r = _signed(endpoint, "Logs_20140328.DescribeLogStreams", b"{}", service="s3")
    assert r.json()["__type"] == "InvalidSignatureException" and "'logs'" in r.json()["message"]
    # The clock: 15 minutes either way, as AWS.
    real_now = botocore.auth.get_current_datetime
    for skew, ok in ((-16, False), (16, False), (-14, True), (14, True)):
        monkeypatch.setattr(botocore.auth, "get_current_datetime", lambda s=skew: real_now() + timedelta(minutes=s))
        sm = client("sagemaker", url, keys)
        if ok:
            sm.list_training_jobs()
        else:
            c, message = code(sm)
            assert c == "InvalidSignatureException"
            assert message.startswith("Signature expired" if skew < 0 else "Signature not yet current")
    monkeypatch.setattr(botocore.auth, "get_current_datetime", real_now)
    client("sagemaker", url, keys).list_training_jobs()


def test_a_tampered_body_or_a_half_signature_is_refused(endpoint):
    body = json.dumps({"TrainingJobName": "x"}).encode()
    headers = _signed_headers(endpoint, "SageMaker.DescribeTrainingJob", body)
    r = httpx.post(endpoint.url + "/", content=body.replace(b'"x"', b'"y"'), headers=headers)
    assert r.status_code == 400 and r.json()["__type"] == "InvalidSignatureException"
    r = httpx.post(endpoint.url + "/", content=body, headers={**headers, "X-Amz-Target": "SageMaker.StopTrainingJob"})
    assert r.json()["__type"] == "InvalidSignatureException"  # the target is signed: it cannot be swapped
    half = {**headers, "Authorization": headers["Authorization"].split(", Signature=")[0]}
    r = httpx.post(endpoint.url + "/", content=body, headers=half)
    assert r.json()["__type"] == "IncompleteSignatureException" and "Signature" in r.json()["message"]
    r = httpx.post(endpoint.url + "/", content=body, headers={**headers, "Authorization": "Bearer abc"})
    assert r.json()["__type"] == "IncompleteSignatureException"


def test_a_revoked_or_expired_token_loses_its_aws_keys_at_once(endpoint):
    admin = {"Authorization": f"Bearer {endpoint.admin}"}
    body = {"aws": True, "role": "member", "tenant": endpoint.tenant}
    made = httpx.post(endpoint.url + "/v1/tokens", json=body, headers=admin).json()
    sm = client("sagemaker", endpoint.url, (made["aws_access_key_id"], made["aws_secret_access_key"]))
    sm.list_training_jobs()
    listed = httpx.get(endpoint.url + "/v1/tokens", headers=admin).json()
    row = next(t for t in listed if t["id"] == made["id"])
    assert row["aws_access_key_id"] == made["aws_access_key_id"] and "aws_secret_access_key" not in row
    httpx.delete(endpoint.url + f"/v1/tokens/{made['id']}", headers=admin).raise_for_status()
    with pytest.raises(ClientError) as err:
        sm.list_training_jobs()
    assert _error(err.value)[0] == "UnrecognizedClientException"
    with endpoint.app.state.db.session() as s:  # an expired token, as the store sees it
        token = repo.find_token_by_access_key(s, endpoint.keys[0])
        token.expires_at = time.time() - 1
    endpoint.app.state.tokens = type(endpoint.app.state.tokens)()  # past the 10 s cache
    with pytest.raises(ClientError) as err:
        endpoint.sm.list_training_jobs()
    assert _error(err.value)[0] == "UnrecognizedClientException"


def test_roles_tenants_and_regions_are_isolated(endpoint):
    sm = endpoint.sm
    arn = sm.create_training_job(**request("mine"))["TrainingJobArn"]
    viewer_keys = aws_keys(endpoint.url, endpoint.admin, role="viewer", tenant=endpoint.tenant)
    viewer = client("sagemaker", endpoint.url, viewer_keys)
    assert viewer.describe_training_job(TrainingJobName="mine")["TrainingJobArn"] == arn
    for call in (
        lambda: viewer.create_training_job(**request("viewers-job")),
        lambda: viewer.stop_training_job(TrainingJobName="mine"),
        lambda: viewer.add_tags(ResourceArn=arn, Tags=[{"Key": "k", "Value": "v"}]),
    ):
        with pytest.raises(ClientError) as err:
            call()
        assert _error(err.value)[0] == "AccessDeniedException"
    other_keys = aws_keys(endpoint.url, endpoint.admin, role="member", tenant=endpoint.tenant + "-other")
    other = client("sagemaker", endpoint.url, other_keys)
    assert other.list_training_jobs()["TrainingJobSummaries"] == []
    for call in (
        lambda: other.describe_training_job(TrainingJobName="mine"),
        lambda: other.stop_training_job(TrainingJobName="mine"),
    ):
        with pytest.raises(ClientError) as err:
            call()
        assert _error(err.value) == ("ValidationException", "Requested resource not found.")
    with pytest.raises(other.exceptions.ResourceNotFound):
        other.list_tags(ResourceArn=arn)
    other.create_training_job(**request("mine"))  # the same name is free in another tenant (account)
    assert other.describe_training_job(TrainingJobName="mine")["TrainingJobArn"] != arn
    west = client("sagemaker", endpoint.url, endpoint.keys, region="us-west-2")
    assert west.list_training_jobs()["TrainingJobSummaries"] == []  # SageMaker is regional
    west.create_training_job(**request("mine"))
    assert ":us-west-2:" in west.describe_training_job(TrainingJobName="mine")["TrainingJobArn"]
    assert sm.describe_training_job(TrainingJobName="mine")["TrainingJobArn"] == arn
    assert not _job(endpoint, "mine").stop_requested


def _channel(uri: str, **extra) -> dict:
    return {
        "ChannelName": "train",
        "DataSource": {"S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": uri}},
        **extra,
    }


# --- CloudWatch Logs, served from the node logs --------------------------------------------------------


def _attempt_with_logs(endpoint, tmp_path, name: str, number: int, state: str, lines: dict[str, str]) -> None:
    """Attempt `number` of job `name`, launched on the local backend now with these node logs."""
    attempt_with_logs(endpoint, tmp_path, name, number, state, lines)


def test_the_sdks_log_calls_read_each_hosts_output_across_attempts(endpoint, tmp_path):
    endpoint.sm.create_training_job(
        **request("logged", ResourceConfig={"InstanceType": "ml.c5.xlarge", "InstanceCount": 2, "VolumeSizeInGB": 1})
    )
    logs = client("logs", endpoint.url, endpoint.keys)
    group = "/aws/sagemaker/TrainingJobs"
    assert logs.describe_log_streams(logGroupName=group, logStreamNamePrefix="logged/")["logStreams"] == []
    first = {"algo-1": "".join(f"a1 line {i}\n" for i in range(5)), "algo-2": "a1 other host\n"}
    _attempt_with_logs(endpoint, tmp_path, "logged", 1, "Failed", first)
    _attempt_with_logs(endpoint, tmp_path, "logged", 2, "Running", {"algo-1": "a2 line 0\na2 line 1\na2 partial"})
    streams = logs.describe_log_streams(logGroupName=group, logStreamNamePrefix="logged/", orderBy="LogStreamName")
    names = [x["logStreamName"] for x in streams["logStreams"]]
    assert len(names) == 2 and names[0].startswith("logged/algo-1-") and names[1].startswith("logged/algo-2-")

    def read_all(stream: str, **kwargs) -> tuple[list[str], str]:
        out, token, args = [], None, {"startFromHead": True, **kwargs}
        while True:
            page = logs.get_log_events(logGroupName=group, logStreamName=stream, **args)
            out += [e["message"] for e in page["events"]]
            if page["nextForwardToken"] == token:
                return out, token  # CloudWatch's end of stream: the same token, no events
            token = page["nextForwardToken"]
            args = {"nextToken": token}

    messages, token = read_all(names[0], limit=2)
    assert messages == [f"a1 line {i}" for i in range(5)] + ["a2 line 0", "a2 line 1"]  # not the partial line
    with open(tmp_path / "logged" / "attempt-2" / "algo-1" / "logs" / "node.log", "a") as f:
        f.write(" now whole\n")
    page = logs.get_log_events(logGroupName=group, logStreamName=names[0], nextToken=token)
    assert [e["message"] for e in page["events"]] == ["a2 partial now whole"]
    assert read_all(names[1])[0] == ["a1 other host"]
    tail = logs.get_log_events(logGroupName=group, logStreamName=names[0], limit=2)  # newest first page
    assert [e["message"] for e in tail["events"]] == ["a2 line 1", "a2 partial now whole"]
    back = logs.get_log_events(logGroupName=group, logStreamName=names[0], nextToken=tail["nextBackwardToken"])
    assert [e["message"] for e in back["events"]][-1] == "a2 line 0"
    for bad in ({"logStreamName": "logged/algo-3-1"}, {"logStreamName": "nope/algo-1-1"}):
        with pytest.raises(logs.exceptions.ResourceNotFoundException):
            logs.get_log_events(logGroupName=group, **bad)
    with pytest.raises(logs.exceptions.ResourceNotFoundException):
        logs.describe_log_streams(logGroupName="/aws/lambda/x")
    other = client("logs", endpoint.url, aws_keys(endpoint.url, endpoint.admin, tenant=endpoint.tenant + "-x"))
    assert other.describe_log_streams(logGroupName=group, logStreamNamePrefix="logged/")["logStreams"] == []
    with pytest.raises(other.exceptions.ResourceNotFoundException):
        other.get_log_events(logGroupName=group, logStreamName=names[0])
