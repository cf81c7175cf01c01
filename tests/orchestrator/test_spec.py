"""The job spec: validation that names every bad field, YAML/JSON loading, SageMaker mapping."""

from __future__ import annotations

import json
from pathlib import Path

import botocore.session
import pytest
from botocore.validate import ParamValidator
from pydantic import ValidationError

from orchestrator.sagemaker_mapping import request_from_spec, spec_from_document, spec_from_request
from orchestrator.spec import JobSpec, SpecError, format_validation_error

DATA = Path(__file__).parent.parent / "data"
EXAMPLES = Path(__file__).parent.parent.parent / "examples"


def sagemaker_errors(request: dict) -> str:
    """botocore's own validation of a CreateTrainingJob request against the service model."""
    model = botocore.session.get_session().get_service_model("sagemaker")
    shape = model.operation_model("CreateTrainingJob").input_shape
    report = ParamValidator().validate(request, shape)
    return report.generate_report() if report.has_errors() else ""


def test_minimal_spec_gets_sane_defaults():
    spec = JobSpec.model_validate({"name": "tiny", "entrypoint": ["python", "train.py"]})
    assert spec.backend == "local"
    assert spec.resources.instance_count == 1 and spec.resources.procs_per_node == 1
    assert spec.retry.max_restarts == 3
    assert spec.health.hang_floor_s > 0


def test_health_preflight_is_validated_and_reaches_the_agent_as_given():
    from aerie_contracts.health import HealthSettings

    spec = JobSpec.model_validate({"name": "pf", "entrypoint": ["x"]})
    assert spec.health.preflight.enabled is False and spec.health.preflight.budget_s == 60
    given = {"enabled": True, "budget_s": 30, "min_cpu_gflops": 2.5, "collective_mb": 4}
    spec = JobSpec.model_validate({"name": "pf", "entrypoint": ["x"], "health": {"preflight": given}})
    agent_side = HealthSettings.from_dict(json.loads(json.dumps(spec.health.model_dump()))).preflight
    assert agent_side.enabled and agent_side.budget_s == 30 and agent_side.min_cpu_gflops == 2.5
    bad = {"budget_s": 0, "min_link_gbps": -1, "collective_mb": 4096, "bogus": 1}
    with pytest.raises(ValidationError) as err:
        JobSpec.model_validate({"name": "pf", "entrypoint": ["x"], "health": {"preflight": bad}})
    text = format_validation_error(err.value)
    for name in ("budget_s", "min_link_gbps", "collective_mb", "bogus"):
        assert f"health.preflight.{name}" in text, text


def test_every_bad_field_is_named_at_once():
    bad = {
        "name": "-bad name-",
        "entrypoint": ["x"],
        "resources": {"instance_count": 0},
        "retry": {"max_restarts": "many"},
    }
    with pytest.raises(ValidationError) as info:
        JobSpec.model_validate(bad)
    text = format_validation_error(info.value)
    assert "name:" in text and "resources.instance_count:" in text and "retry.max_restarts:" in text
    assert len(text.splitlines()) == 3


def test_unknown_fields_are_errors_not_silently_ignored():
    with pytest.raises(ValidationError, match="resorces"):
        JobSpec.model_validate({"name": "a", "entrypoint": ["x"], "resorces": {}})


def test_numeric_hyperparameters_become_strings_and_are_capped():
    spec = JobSpec.model_validate({"name": "a", "entrypoint": ["x"], "hyperparameters": {"lr": 0.1, "n": 3}})
    assert spec.hyperparameters == {"lr": "0.1", "n": "3"}
    with pytest.raises(ValidationError, match="at most 100"):
        JobSpec.model_validate({"name": "a", "entrypoint": ["x"], "hyperparameters": {str(i): "1" for i in range(101)}})


def test_load_yaml_and_json(tmp_path):
    y = tmp_path / "job.yaml"
    y.write_text("name: from-yaml\nentrypoint: [python, t.py]\nresources: {instance_count: 2}\n")
    assert JobSpec.load(y).resources.instance_count == 2
    j = tmp_path / "job.json"
    j.write_text(json.dumps({"name": "from-json", "entrypoint": ["python", "t.py"]}))
    assert JobSpec.load(j).name == "from-json"


def test_unreadable_or_non_mapping_documents_give_clear_errors(tmp_path):
    with pytest.raises(SpecError, match="cannot read"):
        JobSpec.load(tmp_path / "missing.yaml")
    (tmp_path / "list.yaml").write_text("- a\n- b\n")
    with pytest.raises(SpecError, match="must hold a mapping"):
        JobSpec.load(tmp_path / "list.yaml")
    (tmp_path / "broken.yaml").write_text("name: [unclosed\n")
    with pytest.raises(SpecError, match="not valid YAML"):
        JobSpec.load(tmp_path / "broken.yaml")


def test_create_training_job_round_trip_validates_against_botocore():
    request = json.loads((DATA / "create_training_job.json").read_text())
    assert sagemaker_errors(request) == "", "the fixture itself must be a valid request"
    spec = spec_from_request(request)
    assert spec.name == "pythia-160m-pretrain"
    assert spec.resources.instance_count == 2 and spec.resources.instance_type == "ml.p4d.24xlarge"
    assert spec.inputs[0].channel == "train" and spec.inputs[0].s3_uri == "s3://aerie-data/pile/train/"
    assert spec.checkpoint and spec.checkpoint.s3_uri == "s3://aerie-checkpoints/pythia-160m/"
    # A raw request's CheckpointConfig is a request for SageMaker's own sync, and keeps it.
    assert spec.checkpoint.sagemaker_sync and spec.checkpoint.local_path == "/opt/ml/checkpoints"
    assert spec.retry.max_restarts == 3 and spec.tags == {"team": "pretraining", "cost-center": "llm"}
    assert spec.entrypoint == ["python", "-m", "trainer.train"]
    again = request_from_spec(spec)
    assert again == request
    assert sagemaker_errors(again) == ""
    # A raw request is recognised wherever a spec is accepted.
    assert spec_from_document(request) == spec


def test_spec_to_create_training_job_needs_sagemaker_fields():
    spec = JobSpec.model_validate({"name": "a", "entrypoint": ["x"]})
    with pytest.raises(ValueError, match="instance type"):
        request_from_spec(spec)
    spec = JobSpec.model_validate(
        {
            "name": "a",
            "entrypoint": ["x"],
            "resources": {"instance_type": "ml.g5.xlarge"},
            "output": {"s3_uri": "s3://b/out"},
            "backend_options": {"sagemaker": {"RoleArn": "arn:aws:iam::1:role/r"}},
        }
    )
    request = request_from_spec(spec)
    assert sagemaker_errors(request) == ""
    assert request["AlgorithmSpecification"]["ContainerEntrypoint"] == ["x"]


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_examples_are_valid_specs(path):
    JobSpec.load(path)


def test_channels_keep_their_mode_and_distribution_through_sagemaker_and_pipe_is_sagemaker_only():
    """SageMaker receives the channels unchanged (it downloads or streams them itself)."""
    request = json.loads((DATA / "create_training_job.json").read_text())
    request["InputDataConfig"] = [
        {
            "ChannelName": "train",
            "DataSource": {
                "S3DataSource": {
                    "S3DataType": "S3Prefix",
                    "S3Uri": "s3://aerie-data/pile/train/",
                    "S3DataDistributionType": "ShardedByS3Key",
                }
            },
            "InputMode": "FastFile",
        },
        {
            "ChannelName": "events",
            "DataSource": {
                "S3DataSource": {
                    "S3DataType": "S3Prefix",
                    "S3Uri": "s3://aerie-data/events/",
                    "S3DataDistributionType": "FullyReplicated",
                }
            },
            "InputMode": "Pipe",
        },
    ]
    spec = spec_from_request(request)
    assert (spec.inputs[0].mode, spec.inputs[0].distribution) == ("FastFile", "ShardedByS3Key")
    again = request_from_spec(spec)
    assert again["InputDataConfig"] == request["InputDataConfig"]
    assert sagemaker_errors(again) == ""
    local = spec.model_dump() | {"backend": "local", "backend_options": {}}
    with pytest.raises(ValidationError, match="Pipe mode is SageMaker's own"):
        JobSpec.model_validate(local)
    local["inputs"] = local["inputs"][:1]
    assert JobSpec.model_validate(local).inputs[0].distribution == "ShardedByS3Key"


def test_memory_checkpoint_interval_is_auto_a_count_or_off():
    """checkpoint.memory_every_steps (issue #22): `auto` by default, a step count, 0 for off."""
    from orchestrator.spec import CheckpointConfig

    assert CheckpointConfig().memory_every_steps == "auto"
    assert CheckpointConfig(memory_every_steps=25).memory_every_steps == 25
    assert CheckpointConfig(memory_every_steps=0).memory_every_steps == 0
    for bad in (-1, "often", 2.5):
        with pytest.raises(ValidationError):
            CheckpointConfig(memory_every_steps=bad)


def test_s3_checkpoint_interval_is_a_count_or_auto():
    """checkpoint.every_steps (issue #24): 100 by default, a positive step count, or `auto` (the
    trainer adopts the Young–Daly interval it measures)."""
    from orchestrator.spec import CheckpointConfig

    assert CheckpointConfig().every_steps == 100
    assert CheckpointConfig(every_steps=25).every_steps == 25
    assert CheckpointConfig(every_steps="auto").every_steps == "auto"
    for bad in (0, -1, "often", 2.5):
        with pytest.raises(ValidationError):
            CheckpointConfig(every_steps=bad)
