"""Talking to the SageMaker-compatible endpoint as AWS clients do: real boto3 clients signed with
credentials from `POST /v1/tokens {"aws": true}`, and an in-process API served over real HTTP."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from types import SimpleNamespace

import boto3
import httpx
import uvicorn
from botocore.config import Config

from devtools.harness.control_plane import free_port

REGION = "us-east-1"
ROLE = "arn:aws:iam::123456789012:role/AerieTraining"


@contextlib.contextmanager
def serve(app) -> Iterator[str]:
    """The app on a free loopback port (uvicorn in a thread), for clients that need real HTTP."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 20
    while not server.started:
        assert time.time() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    try:
        yield url
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@contextlib.contextmanager
def served_api(home) -> Iterator[SimpleNamespace]:
    """An API of its own under `home`, over real HTTP, without a controller: `.url`, `.app`, and
    `.admin` (its admin token)."""
    from orchestrator.server import build_app
    from orchestrator.settings import Settings

    settings = Settings(home=home)
    app = build_app(settings, with_controller=False)
    admin = settings.admin_token_path.read_text().strip()
    with serve(app) as url:
        yield SimpleNamespace(url=url, app=app, admin=admin)


def served_api_fixture(name: str):
    """A module-scoped pytest fixture: one `served_api` for the test module, under a temporary
    home named `name`; each test works in a tenant of its own (tenants share nothing)."""
    import pytest

    @pytest.fixture(scope="module")
    def server(tmp_path_factory):
        with served_api(tmp_path_factory.mktemp(name)) as api:
            yield api

    return server


def attempt_with_logs(endpoint, tmp_path, name: str, number: int, state: str, lines: dict, started=None):
    """Attempt `number` of `endpoint.tenant`'s job `name`, launched on the local backend at `started`
    (default: now) with these node logs ({host: text}, as `<root>/<host>/logs/node.log`); its root."""
    from orchestrator.store import repo

    root = tmp_path / name / f"attempt-{number}"
    for host, text in lines.items():
        (root / host / "logs").mkdir(parents=True)
        (root / host / "logs" / "node.log").write_text(text)
    with endpoint.app.state.db.session() as s:
        job = repo.get_job(s, endpoint.tenant, name)
        a = repo.create_attempt(s, job, number)
        a.handle = {"root": str(root), "hosts": sorted(lines)}
        a.state, a.started_at = state, time.time() if started is None else started
    return root


def aws_keys(url: str, admin_token: str, **body) -> tuple[str, str]:
    """(access key id, secret access key) of a new token made by `admin_token` (role, tenant, ...)."""
    r = httpx.post(
        url + "/v1/tokens", json={"aws": True, **body}, headers={"Authorization": f"Bearer {admin_token}"}, timeout=30
    )
    assert r.status_code == 201, r.text
    return r.json()["aws_access_key_id"], r.json()["aws_secret_access_key"]


def client(service: str, url: str, keys: tuple[str, str], region: str = REGION, retries: int = 0):
    """A boto3 client of `service` ("sagemaker", "logs") pointed at Aerie, signing with `keys`."""
    return boto3.session.Session(aws_access_key_id=keys[0], aws_secret_access_key=keys[1], region_name=region).client(
        service, endpoint_url=url, config=Config(retries={"max_attempts": retries + 1, "mode": "standard"})
    )


def request(name: str, **overrides) -> dict:
    """A small CreateTrainingJob request (the tiny trainer's command), with overrides."""
    body = {
        "TrainingJobName": name,
        "RoleArn": ROLE,
        "AlgorithmSpecification": {
            "TrainingImage": "123456789012.dkr.ecr.us-east-1.amazonaws.com/aerie-trainer:1",
            "TrainingInputMode": "File",
            "ContainerEntrypoint": ["python", "-m", "trainer.train"],
            "ContainerArguments": ["--config", "examples/configs/pythia-tiny.yaml"],
        },
        "OutputDataConfig": {"S3OutputPath": "s3://aerie/output"},
        "ResourceConfig": {"InstanceType": "ml.c5.xlarge", "InstanceCount": 1, "VolumeSizeInGB": 10},
        "StoppingCondition": {"MaxRuntimeInSeconds": 3600},
    }
    body.update(overrides)
    return body


def aws_profile(directory, credentials: str, aerie_url: str, aws_standin_url: str, profile: str = "aerie") -> dict:
    """The environment a SageMaker launcher runs with to reach Aerie: an AWS profile (config +
    credentials files, as `aws configure` leaves them) whose `sagemaker` and `cloudwatch_logs`
    endpoints are Aerie, and whose `s3`, `sts` and `iam` go to the stand-in for AWS's own services
    (the dev stack's moto server). `credentials` is `aerie token create --aws --profile NAME`'s output.
    The SDK's telemetry is opted out (no internet here) and its client-side IAM role check is off
    (it simulates IAM policies, which the stand-in cannot answer)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "credentials").write_text(credentials)
    services = {"sagemaker": aerie_url, "cloudwatch_logs": aerie_url}
    services |= {name: aws_standin_url for name in ("s3", "sts", "iam")}
    lines = [
        f"[profile {profile}]",
        f"region = {REGION}",
        "services = aerie-endpoints",
        "",
        "[services aerie-endpoints]",
    ]
    for name, url in services.items():
        lines += [f"{name} =", f"  endpoint_url = {url}"]
    (directory / "config").write_text("\n".join(lines) + "\n")
    (directory / "sagemaker.yaml").write_text(
        "SchemaVersion: '1.0'\nSageMaker:\n  PythonSDK:\n    Modules:\n      TelemetryOptOut: true\n"
    )
    return {
        "AWS_CONFIG_FILE": str(directory / "config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(directory / "credentials"),
        "AWS_PROFILE": profile,
        "SAGEMAKER_USER_CONFIG_OVERRIDE": str(directory / "sagemaker.yaml"),
        "SAGEMAKER_VALIDATE_ROLE": "false",
    }
