"""A SageMaker launcher as users write it, run unchanged against Aerie by the SDK e2e test.

The SageMaker Python SDK 3.x (`sagemaker.train.ModelTrainer`) with a custom image, a command
instead of an entry-point script, 2 instances, a retry strategy, checkpoints and metric
definitions; its session is built on a boto3 session and SageMaker client. Where AWS is reached
is decided outside this file, as for any launcher: the AWS profile named by AWS_PROFILE, whose
config sends `sagemaker` and `logs` to Aerie (and `s3`, `sts`, `iam` to the stand-in for AWS).

Usage: python tests/e2e/sagemaker_sdk_train.py JOB_SETTINGS_JSON  (prints the job name last)
"""

from __future__ import annotations

import json
import logging
import sys

import boto3
from sagemaker.core.helper.session_helper import Session
from sagemaker.train import ModelTrainer
from sagemaker.train.configs import (
    CheckpointConfig,
    Compute,
    MetricDefinition,
    RetryStrategy,
    SourceCode,
    StoppingCondition,
    Tag,
)


def main(settings: dict) -> str:
    # The SDK leaves logging to the application; a launcher that wants to see the job's output says so.
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    boto_session = boto3.Session()  # the profile from AWS_PROFILE, as a launcher's would be
    session = Session(
        boto_session=boto_session,
        sagemaker_client=boto_session.client("sagemaker"),
        default_bucket=settings["bucket"],  # where the SDK stages code (else sagemaker-<region>-<account>)
    )
    trainer = ModelTrainer(
        sagemaker_session=session,
        role=settings["role"],
        training_image=settings["image"],
        base_job_name=settings["base_job_name"],
        source_code=SourceCode(command=settings["command"]),
        compute=Compute(instance_type="ml.c5.xlarge", instance_count=2),
        stopping_condition=StoppingCondition(max_runtime_in_seconds=3600),
        hyperparameters=settings["hyperparameters"],
        environment=settings["environment"],
        checkpoint_config=CheckpointConfig(s3_uri=settings["checkpoint_s3_uri"]),
        tags=[Tag(key=k, value=v) for k, v in settings["tags"].items()],
    )
    trainer = trainer.with_retry_strategy(RetryStrategy(maximum_retry_attempts=settings["retries"]))
    trainer = trainer.with_metric_definitions([MetricDefinition(name="train:loss", regex=r"loss ([0-9.]+)")])
    trainer.train(wait=True, logs=True)
    return trainer._latest_training_job.training_job_name


if __name__ == "__main__":
    name = main(json.loads(sys.argv[1]))
    print(f"TRAINING_JOB_NAME={name}")
