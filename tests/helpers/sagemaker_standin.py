"""A local stand-in for SageMaker Training: its wire protocol outside, its container contract inside.

Outside, it is an HTTP server speaking SageMaker's own JSON protocol (`X-Amz-Target:
SageMaker.CreateTrainingJob` etc., awsJson1_1), so the control plane's unmodified boto3 client
reaches it through `AWS_ENDPOINT_URL_SAGEMAKER`; requests are checked against botocore's service
model, as the real service does. Inside, each instance of a training job is a "container": the
`ContainerEntrypoint` started with exactly what SageMaker gives one —

- `/opt/ml` with `input/config/resourceconfig.json` (SageMaker's layout: `current_host`,
  `current_instance_type`, `current_group_name`, `hosts`, `instance_groups`,
  `network_interface_name`), `hyperparameters.json`, `inputdataconfig.json`;
- the job's `Environment` plus `TRAINING_JOB_NAME`, `TRAINING_JOB_ARN` and `AWS_REGION`;
- host names `algo-1..N` that resolve to the instances;
- `CheckpointConfig`'s objects copied to `LocalPath` before the start, when a request has one —

and nothing else: no `SM_*`, no `AERIE_ML_ROOT`, no `AERIE_NODE_DIR`. Each container runs in a
mount namespace of its own (`unshare --mount`, root) where a directory of the test is bind-mounted
on `/opt` (so `/opt/ml` is per instance, as in a container) and a hosts file naming `algo-1..N` as
127.0.0.1 on `/etc/hosts`; nothing on the machine changes. The "image" is this checkout's Python
environment; its "instance role" and "network" are the loopback S3 server's variables.

The job ends as SageMaker ends it: Completed when every container exits 0; Failed as soon as one
exits non-zero (the others are sent SIGTERM), with `FailureReason` "AlgorithmError: " + that
container's `/opt/ml/output/failure`; StopTrainingJob sends SIGTERM (SIGKILL 20 s later).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import boto3
import botocore.session
from botocore.validate import ParamValidator

from agent.proctree import kill_subtree

ACCOUNT, REGION = "123456789012", "us-east-1"
IMAGE_WORKDIR = "/opt/ml/code"  # the trainer image's WORKDIR (containers/trainer/Dockerfile)
# Mount a per-instance /opt (holding ml/) and the hosts file, then become the container's entrypoint.
# Paths arrive as positional arguments: nothing is pasted into the script.
CONTAINER = 'mount --bind "$1" /opt && mount --bind "$2" /etc/hosts && cd "$3" && shift 3 && exec "$@"'


@dataclass
class TrainingJob:
    name: str
    request: dict[str, Any]
    root: Path
    created: float = field(default_factory=time.time)
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    status: str = "InProgress"
    secondary: str = "Starting"
    failure: str | None = None
    ended: float | None = None
    stop_requested: float | None = None
    staged: dict[str, list[str]] = field(default_factory=dict)  # host -> files CheckpointConfig copied

    def host_root(self, host: str) -> Path:
        return self.root / host / "opt" / "ml"


class SageMakerStandIn:
    def __init__(self, workdir: Path, image_env: dict[str, str]):
        self.workdir = Path(workdir)
        self.image_env = dict(image_env)
        self.jobs: dict[str, TrainingJob] = {}
        self.requests: list[str] = []  # the request log: every API operation called, in order
        self.lock = threading.Lock()
        model = botocore.session.get_session().get_service_model("sagemaker")
        self._inputs = {op: model.operation_model(op).input_shape for op in model.operation_names}
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._watcher = threading.Thread(target=self._watch, daemon=True)
        self._running = True

    def start(self) -> SageMakerStandIn:
        self._thread.start()
        self._watcher.start()
        return self

    def close(self) -> None:
        """Shut the API down and kill every container's whole process tree (the instances go away)."""
        self._running = False
        self.server.shutdown()
        for job in self.jobs.values():
            for proc in job.procs.values():
                kill_subtree(proc.pid)
                proc.wait()

    # --- the API -----------------------------------------------------------------------------

    def CreateTrainingJob(self, req: dict[str, Any]) -> dict[str, Any]:
        name = req["TrainingJobName"]
        with self.lock:
            if name in self.jobs:
                raise SageMakerFault("ResourceInUse", f"Training job names must be unique: {name}")
            job = self.jobs[name] = TrainingJob(name, req, self.workdir / name)
        count = req["ResourceConfig"]["InstanceCount"]
        itype = req["ResourceConfig"]["InstanceType"]
        hosts = [f"algo-{i + 1}" for i in range(count)]
        hosts_file = job.root / "hosts"
        hosts_file.parent.mkdir(parents=True)
        hosts_file.write_text(Path("/etc/hosts").read_text() + "\n127.0.0.1 " + " ".join(hosts) + "\n")
        for host in hosts:
            self._prepare(job, host, hosts, itype)
        for host in hosts:
            job.procs[host] = self._run(job, host, hosts_file)
        job.secondary = "Training"
        return {"TrainingJobArn": self._arn(name)}

    def DescribeTrainingJob(self, req: dict[str, Any]) -> dict[str, Any]:
        job = self._job(req["TrainingJobName"])
        out = {
            "TrainingJobName": job.name,
            "TrainingJobArn": self._arn(job.name),
            "ModelArtifacts": {"S3ModelArtifacts": job.request["OutputDataConfig"]["S3OutputPath"]},
            "TrainingJobStatus": job.status,
            "SecondaryStatus": job.secondary,
            "AlgorithmSpecification": job.request["AlgorithmSpecification"],
            "ResourceConfig": job.request["ResourceConfig"],
            "StoppingCondition": job.request["StoppingCondition"],
            "CreationTime": job.created,
            "SecondaryStatusTransitions": [{"Status": "Training", "StartTime": job.created}],
        }
        if job.failure:
            out["FailureReason"] = job.failure
        if job.ended:
            out["TrainingEndTime"] = job.ended
        return out

    def StopTrainingJob(self, req: dict[str, Any]) -> dict[str, Any]:
        job = self._job(req["TrainingJobName"])
        if job.status != "InProgress":
            raise SageMakerFault("ValidationException", f"The job status is {job.status}")
        job.status, job.secondary, job.stop_requested = "Stopping", "Stopping", time.time()
        self._signal(job, signal.SIGTERM)
        return {}

    # --- containers --------------------------------------------------------------------------

    def _prepare(self, job: TrainingJob, host: str, hosts: list[str], itype: str) -> None:
        ml = job.host_root(host)
        config = ml / "input" / "config"
        config.mkdir(parents=True)
        (ml / "code").mkdir()
        (ml / "model").mkdir()
        (ml / "output" / "data").mkdir(parents=True)
        group = "homogeneousCluster"
        rc = {
            "current_host": host,
            "current_instance_type": itype,
            "current_group_name": group,
            "hosts": hosts,
            "instance_groups": [{"instance_group_name": group, "instance_type": itype, "hosts": hosts[::-1]}],
            "network_interface_name": "eth0",
        }
        (config / "resourceconfig.json").write_text(json.dumps(rc))
        (config / "hyperparameters.json").write_text(json.dumps(job.request.get("HyperParameters") or {}))
        channels = {
            c["ChannelName"]: {"TrainingInputMode": c.get("InputMode", "File"), "S3DistributionType": "FullyReplicated"}
            for c in job.request.get("InputDataConfig") or []
        }
        (config / "inputdataconfig.json").write_text(json.dumps(channels))
        ck = job.request.get("CheckpointConfig")
        if ck:  # SageMaker copies everything under S3Uri to LocalPath before the container starts
            local = Path(str(ml) + ck.get("LocalPath", "/opt/ml/checkpoints")[len("/opt/ml") :])
            job.staged[host] = _download_prefix(ck["S3Uri"], local)

    def _run(self, job: TrainingJob, host: str, hosts_file: Path) -> subprocess.Popen:
        algo = job.request["AlgorithmSpecification"]
        argv = list(algo.get("ContainerEntrypoint") or []) + list(algo.get("ContainerArguments") or [])
        env = {
            **self.image_env,
            **(job.request.get("Environment") or {}),
            "TRAINING_JOB_NAME": job.name,
            "TRAINING_JOB_ARN": self._arn(job.name),
            "AWS_REGION": REGION,
        }
        log = open(job.root / f"{host}.log", "ab")  # the instance's CloudWatch stream
        opt = job.host_root(host).parent
        cmd = ["unshare", "--mount", "--propagation", "private", "sh", "-c", CONTAINER, "sh"]
        cmd += [str(opt), str(hosts_file), IMAGE_WORKDIR, *argv]
        return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def _watch(self) -> None:
        while self._running:
            for job in list(self.jobs.values()):
                self._update(job)
            time.sleep(0.2)

    def _update(self, job: TrainingJob) -> None:
        if job.status not in ("InProgress", "Stopping"):
            return
        if len(job.procs) < job.request["ResourceConfig"]["InstanceCount"]:
            # CreateTrainingJob is still starting the containers: with none started yet, "every
            # container exited 0" held vacuously, and one test run saw attempt 2 Completed 16 ms
            # after it was created, before any rank ran.
            return
        codes = {h: p.poll() for h, p in job.procs.items()}
        if job.status == "Stopping":
            if job.stop_requested and time.time() - job.stop_requested > 20:
                self._signal(job, signal.SIGKILL)
            if all(c is not None for c in codes.values()):
                job.status, job.secondary, job.ended = "Stopped", "Stopped", time.time()
            return
        failed = [h for h, c in codes.items() if c not in (None, 0)]
        if failed:
            host = failed[0]
            why = job.host_root(host) / "output" / "failure"
            text = why.read_text().strip() if why.exists() else f"exit code {codes[host]}"
            job.status, job.secondary, job.ended = "Failed", "Failed", time.time()
            job.failure = f"AlgorithmError: {text}"[:1024]
            self._signal(job, signal.SIGTERM)  # SageMaker tears the other instances down
        elif all(c == 0 for c in codes.values()):
            job.status, job.secondary, job.ended = "Completed", "Completed", time.time()

    def _signal(self, job: TrainingJob, sig: int) -> None:
        for proc in job.procs.values():
            if proc.poll() is None:
                proc.send_signal(sig)

    # --- plumbing ----------------------------------------------------------------------------

    def _job(self, name: str) -> TrainingJob:
        if name not in self.jobs:
            raise SageMakerFault("ValidationException", f"Requested resource not found: {name}")
        return self.jobs[name]

    def _arn(self, name: str) -> str:
        return f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:training-job/{name}"

    def _handler(self):
        standin = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                op = self.headers.get("X-Amz-Target", "").removeprefix("SageMaker.")
                standin.requests.append(op)
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                try:
                    fn = getattr(standin, op, None)
                    if fn is None or op not in standin._inputs:
                        raise SageMakerFault("UnknownOperationException", f"not modelled by the stand-in: {op}")
                    report = ParamValidator().validate(body, standin._inputs[op])
                    if report.has_errors():
                        raise SageMakerFault("ValidationException", report.generate_report())
                    status, out = 200, fn(body)
                except SageMakerFault as exc:
                    status, out = 400, {"__type": exc.code, "message": str(exc)}
                data = json.dumps(out).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/x-amz-json-1.1")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        return Handler


class SageMakerFault(Exception):
    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


def _download_prefix(uri: str, local: Path) -> list[str]:
    bucket, _, prefix = uri.removeprefix("s3://").partition("/")
    s3 = boto3.client("s3")
    got = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix.rstrip("/") + "/"):
        for obj in page.get("Contents", []):
            rel = obj["Key"][len(prefix.rstrip("/")) + 1 :]
            (local / rel).parent.mkdir(parents=True, exist_ok=True)
            s3.download_file(bucket, obj["Key"], str(local / rel))
            got.append(rel)
    return got


def image_env(extra: dict[str, str]) -> dict[str, str]:
    """The "image's" own environment: this checkout's Python first on PATH, a home, a locale."""
    venv_bin = str(Path(sys.executable).parent)
    path = f"{venv_bin}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    return {"PATH": path, "HOME": os.environ.get("HOME", "/root"), "LANG": "C.UTF-8", **extra}
