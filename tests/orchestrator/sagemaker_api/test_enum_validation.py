"""CreateTrainingJob refuses what SageMaker refuses: every enum-typed field is checked against
botocore's own service model, and every validation message names AWS's field path.

Real boto3 clients talk to an in-process API over real HTTP (tests/helpers/sagemaker.py). boto3
validates parameters against the same model on the client before it sends anything, so these
clients are made with `Config(parameter_validation=False)`: the invalid values reach the server,
as they do from any client that does not validate (the AWS CLI with its own JSON, other SDKs,
hand-signed requests), and the server has to refuse them itself.
"""

from __future__ import annotations

import copy
import uuid

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError
from botocore.model import ShapeResolver

from orchestrator.sagemaker_api import shapes
from tests.helpers.sagemaker import REGION, aws_keys, request, served_api_fixture


def _channel(**s3) -> dict:
    return {
        "ChannelName": "train",
        "DataSource": {
            "S3DataSource": {
                "S3DataType": "S3Prefix",
                "S3Uri": "s3://aerie-data/train/",
                "S3DataDistributionType": "FullyReplicated",
                **s3,
            }
        },
        "InputMode": "File",
        "CompressionType": "None",
    }


def _with(path: tuple, value) -> dict:
    """`request()` with one field (a path of keys and list indexes) set to `value`."""
    body = request(f"bad-{uuid.uuid4().hex[:8]}", InputDataConfig=[_channel()])
    here = body
    for key in path[:-1]:
        here = here[key]
    here[path[-1]] = value
    return body


server = served_api_fixture("sagemaker-enums")


@pytest.fixture
def sm(server):
    """A SageMaker client of a tenant of its own that sends what it is given (no client-side checks)."""
    keys = aws_keys(server.url, server.admin, role="member", tenant=f"t-{uuid.uuid4().hex[:8]}")
    session = boto3.session.Session(aws_access_key_id=keys[0], aws_secret_access_key=keys[1], region_name=REGION)
    config = Config(parameter_validation=False, retries={"max_attempts": 1, "mode": "standard"})
    return session.client("sagemaker", endpoint_url=server.url, config=config)


def _refused(sm, body: dict) -> str:
    with pytest.raises(ClientError) as err:
        sm.create_training_job(**body)
    error = err.value.response["Error"]
    assert error["Code"] == "ValidationException", error
    return error["Message"]


ENUM_CASES = [
    # (field, its path in the request, the bad value, AWS's field path, an allowed value listed)
    ("TrainingInputMode", ("AlgorithmSpecification", "TrainingInputMode"), "Bogus",
     "algorithmSpecification.trainingInputMode", "FastFile"),
    ("InstanceType", ("ResourceConfig", "InstanceType"), "ml.bogus.xlarge",
     "resourceConfig.instanceType", "ml.p4d.24xlarge"),
    ("S3DataType", ("InputDataConfig", 0, "DataSource", "S3DataSource", "S3DataType"), "S3Folder",
     "inputDataConfig.1.member.dataSource.s3DataSource.s3DataType", "S3Prefix"),
    ("S3DataDistributionType", ("InputDataConfig", 0, "DataSource", "S3DataSource", "S3DataDistributionType"),
     "Sharded", "inputDataConfig.1.member.dataSource.s3DataSource.s3DataDistributionType", "ShardedByS3Key"),
    ("CompressionType", ("InputDataConfig", 0, "CompressionType"), "Zip",
     "inputDataConfig.1.member.compressionType", "Gzip"),
    ("InputMode", ("InputDataConfig", 0, "InputMode"), "Stream",
     "inputDataConfig.1.member.inputMode", "File"),
    ("OutputDataConfig.CompressionType", ("OutputDataConfig", "CompressionType"), "ZSTD",
     "outputDataConfig.compressionType", "GZIP"),
]  # fmt: skip


def test_each_enum_field_out_of_its_set_is_refused_at_awss_field_path_and_nothing_is_stored(sm):
    for field, where, value, path, allowed in ENUM_CASES:
        message = _refused(sm, _with(where, value))
        assert message.startswith(
            f"1 validation error detected: Value '{value}' at '{path}' failed to satisfy constraint: "
            "Member must satisfy enum value set: ["
        ), (field, message)
        assert allowed in message, (field, message)
    mode = _refused(sm, _with(("AlgorithmSpecification", "TrainingInputMode"), "Bogus"))
    assert mode == (
        "1 validation error detected: Value 'Bogus' at 'algorithmSpecification.trainingInputMode' failed to "
        "satisfy constraint: Member must satisfy enum value set: [Pipe, File, FastFile]"
    )
    assert sm.list_training_jobs()["TrainingJobSummaries"] == []


def test_several_bad_fields_are_reported_together_with_list_members_counted_from_one(sm):
    body = _with(("AlgorithmSpecification", "TrainingInputMode"), "Bogus")
    body["ResourceConfig"]["InstanceType"] = "ml.bogus.xlarge"
    body["InputDataConfig"].append({**_channel(S3DataType="Nope"), "ChannelName": "eval"})
    message = _refused(sm, body)
    assert message.startswith("3 validation errors detected: Value 'Bogus' at 'algorithmSpecification.")
    assert message.count("; Value '") == 2
    assert "Value 'Nope' at 'inputDataConfig.2.member.dataSource.s3DataSource.s3DataType'" in message
    assert "Value 'ml.bogus.xlarge' at 'resourceConfig.instanceType'" in message
    assert sm.list_training_jobs()["TrainingJobSummaries"] == []


def test_spec_errors_name_the_requests_aws_field_paths_not_aeries(sm):
    """What only Aerie's job spec checks (ranges, patterns) is still reported at the field the
    request sent, as AWS writes paths: never the spec's own names (instance_count, max_runtime_s)."""
    cases = [
        (("ResourceConfig", "InstanceCount"), 0, "resourceConfig.instanceCount"),
        (("StoppingCondition", "MaxRuntimeInSeconds"), 10**9, "stoppingCondition.maxRuntimeInSeconds"),
        (("InputDataConfig", 0, "DataSource", "S3DataSource", "S3Uri"), "http://not-s3",
         "inputDataConfig.1.member.dataSource.s3DataSource.s3Uri"),
        (("RetryStrategy",), {"MaximumRetryAttempts": 1000}, "retryStrategy.maximumRetryAttempts"),
    ]  # fmt: skip
    for where, value, path in cases:
        message = _refused(sm, _with(where, value))
        assert message.startswith("1 validation error detected: Value "), message
        assert f" at '{path}' failed to satisfy constraint: " in message, message
        for internal in ("instance_count", "max_runtime_s", "s3_uri", "max_restarts", "ResourceConfig."):
            assert internal not in message, message
    assert sm.list_training_jobs()["TrainingJobSummaries"] == []


def test_a_valid_request_is_still_accepted_without_client_side_checks(sm):
    body = _with(("InputDataConfig", 0, "CompressionType"), "Gzip")
    body["AlgorithmSpecification"]["TrainingInputMode"] = "FastFile"
    arn = sm.create_training_job(**body)["TrainingJobArn"]
    described = sm.describe_training_job(TrainingJobName=body["TrainingJobName"])
    assert described["TrainingJobArn"] == arn
    assert described["InputDataConfig"] == body["InputDataConfig"]
    names = [j["TrainingJobName"] for j in sm.list_training_jobs()["TrainingJobSummaries"]]
    assert names == [body["TrainingJobName"]]


def test_the_rule_walks_lists_and_maps_of_any_shape():
    """One generic rule: lists of enum strings are reported at the list and maps at the map, as
    AWS reports them; lists of structures per member."""
    resolver = ShapeResolver(
        {
            "Req": {
                "type": "structure",
                "members": {
                    "Modes": {"shape": "ModeList"},
                    "ByName": {"shape": "ModeMap"},
                    "Keyed": {"shape": "KeyedMap"},
                    "Items": {"shape": "ItemList"},
                    "Free": {"shape": "Str"},
                },
            },
            "Mode": {"type": "string", "enum": ["A", "B"]},
            "Str": {"type": "string"},
            "ModeList": {"type": "list", "member": {"shape": "Mode"}},
            "ModeMap": {"type": "map", "key": {"shape": "Str"}, "value": {"shape": "Mode"}},
            "KeyedMap": {"type": "map", "key": {"shape": "Mode"}, "value": {"shape": "Str"}},
            "Item": {"type": "structure", "members": {"Mode": {"shape": "Mode"}}},
            "ItemList": {"type": "list", "member": {"shape": "Item"}},
        }
    )
    shape = resolver.get_shape_by_name("Req")
    good = {"Modes": ["A", "B"], "ByName": {"x": "A"}, "Keyed": {"B": "y"}, "Items": [{"Mode": "A"}], "Free": "Z"}
    assert shapes.enum_violations(shape, good) == []
    bad = copy.deepcopy(good) | {"Modes": ["A", "C"], "ByName": {"x": "D"}, "Keyed": {"E": "y"}}
    bad["Items"] = [{"Mode": "A"}, {"Mode": "F"}]
    assert shapes.enum_violations(shape, bad) == [
        "Value '[A, C]' at 'modes' failed to satisfy constraint: "
        "Member must satisfy constraint: [Member must satisfy enum value set: [A, B]]",
        "Value '{x=D}' at 'byName' failed to satisfy constraint: "
        "Map value must satisfy constraint: [Member must satisfy enum value set: [A, B]]",
        "Value '{E=y}' at 'keyed' failed to satisfy constraint: "
        "Map keys must satisfy constraint: [Member must satisfy enum value set: [A, B]]",
        "Value 'F' at 'items.2.member.mode' failed to satisfy constraint: Member must satisfy enum value set: [A, B]",
    ]
    assert shapes.enum_violations(shape, {"Modes": "not a list", "Items": [None, "x"]}) == []  # types: not its part
