"""FilterLogEvents on `/aws/sagemaker/TrainingJobs`, as boto3 and the AWS CLI call it.

The API runs in-process without a controller (jobs stay where the test puts them) behind real
HTTP, as in tests/orchestrator/api/test_sagemaker_api.py; a job's attempts get node logs written
where the local backend writes them (`<root>/<host>/logs/node.log`), so no training runs here.

Both AWS CLIs run against it, each as a user's shell would, in a process of its own:
- v1 (`awscli` on PyPI, in the `dev` extra): `aws logs filter-log-events`, with --endpoint-url
  and through a profile whose `cloudwatch_logs` endpoint is Aerie.
- v2, for `aws logs tail` (v2 only). AWS does not publish v2 on PyPI; the `dev` extra's
  `aws-cdk-asset-awscli-v2` (AWS's CDK asset for a Lambda layer) carries AWS's own self-contained
  Linux x86_64 build of it, which `_aws_v2` unpacks once into pytest's cache. `aws logs tail`
  pages FilterLogEvents from `--since`; `--follow` polls it again from the newest timestamp seen
  and drops the eventIds it has printed, which works here because an event's id is stable.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import uuid
import zipfile
from pathlib import Path
from types import SimpleNamespace

import boto3
import pytest
from botocore.config import Config

from orchestrator import sagemaker_answers
from orchestrator.sagemaker_api import logs as logs_api
from orchestrator.sagemaker_api.errors import AwsError
from orchestrator.sagemaker_api.log_filter_patterns import compile_filter_pattern
from tests.helpers.sagemaker import (
    REGION,
    attempt_with_logs,
    aws_keys,
    aws_profile,
    client,
    request,
    served_api_fixture,
)

GROUP = "/aws/sagemaker/TrainingJobs"
T0 = 1_780_000_000.0  # attempts' start times (s): the events' timestamps are these, in ms


server = served_api_fixture("filter-log-events")


@pytest.fixture
def endpoint(server):
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    keys = aws_keys(server.url, server.admin, role="member", tenant=tenant)
    return SimpleNamespace(
        url=server.url,
        app=server.app,
        admin=server.admin,
        tenant=tenant,
        keys=keys,
        sm=client("sagemaker", server.url, keys),
        logs=client("logs", server.url, keys),
    )


def _job(endpoint, name: str, instances: int = 1) -> None:
    endpoint.sm.create_training_job(
        **request(
            name, ResourceConfig={"InstanceType": "ml.c5.xlarge", "InstanceCount": instances, "VolumeSizeInGB": 1}
        )
    )


def _attempt(endpoint, tmp_path: Path, name: str, number: int, state: str, started: float, lines: dict) -> Path:
    """Attempt `number` of job `name`, launched on the local backend at `started` with these node logs."""
    return attempt_with_logs(endpoint, tmp_path, name, number, state, lines, started)


def _streams(endpoint, prefix: str) -> list[str]:
    found = endpoint.logs.describe_log_streams(logGroupName=GROUP, logStreamNamePrefix=prefix)["logStreams"]
    return sorted(s["logStreamName"] for s in found)


def _all(endpoint, page_size: int | None = None, **args) -> tuple[list[dict], int]:
    """Every event through boto3's paginator, and how many pages it took."""
    config = {"PageSize": page_size} if page_size else {}
    paginator = endpoint.logs.get_paginator("filter_log_events")
    events, pages = [], 0
    for page in paginator.paginate(logGroupName=GROUP, PaginationConfig=config, **args):
        assert page["searchedLogStreams"] == []  # what CloudWatch has returned since 2020
        events += page["events"]
        pages += 1
    return events, pages


def _lines(n: int, tag: str) -> str:
    return "".join(f"{tag} line {i}\n" for i in range(n))


@pytest.fixture
def two_jobs(endpoint, tmp_path):
    """Job `alpha` (2 instances, 2 attempts) and job `beta` (1 instance) started between alpha's
    attempts: the interleaved order is alpha a1 (algo-1, algo-2), beta a1, alpha a2."""
    _job(endpoint, "alpha", instances=2)
    _job(endpoint, "beta")
    _attempt(endpoint, tmp_path, "alpha", 1, "Failed", T0, {"algo-1": _lines(4, "a1h1"), "algo-2": _lines(3, "a1h2")})
    _attempt(endpoint, tmp_path, "beta", 1, "Completed", T0 + 5, {"algo-1": _lines(2, "b1h1") + "b1h1 ERROR: oom"})
    _attempt(endpoint, tmp_path, "alpha", 2, "Running", T0 + 10, {"algo-1": _lines(3, "a2h1") + "a2h1 unfinished"})
    alpha1, alpha2 = _streams(endpoint, "alpha/")
    (beta1,) = _streams(endpoint, "beta/")
    expected = (
        [(alpha1, int(T0 * 1000), f"a1h1 line {i}") for i in range(4)]
        + [(alpha2, int(T0 * 1000), f"a1h2 line {i}") for i in range(3)]
        + [(beta1, int((T0 + 5) * 1000), m) for m in ("b1h1 line 0", "b1h1 line 1", "b1h1 ERROR: oom")]
        + [(alpha1, int((T0 + 10) * 1000), f"a2h1 line {i}") for i in range(3)]
    )
    return SimpleNamespace(alpha1=alpha1, alpha2=alpha2, beta1=beta1, expected=expected, root=tmp_path)


def _triples(events: list[dict]) -> list[tuple[str, int, str]]:
    return [(e["logStreamName"], e["timestamp"], e["message"]) for e in events]


def test_the_paginator_returns_every_line_across_pages_interleaved_by_timestamp(endpoint, two_jobs):
    events, pages = _all(endpoint, page_size=4)
    # a running attempt's unfinished last line is not an event yet; a finished attempt's is
    assert _triples(events) == two_jobs.expected and pages == 4
    assert [e["timestamp"] for e in events] == sorted(e["timestamp"] for e in events)
    assert len({e["eventId"] for e in events}) == len(events)
    assert all(e["eventId"].isdigit() and len(e["eventId"]) == 56 and e["ingestionTime"] > 0 for e in events)
    everything, one_page = _all(endpoint)  # the default limit (10,000): one page, no token
    assert _triples(everything) == two_jobs.expected and one_page == 1
    # `interleaved` is accepted and ignored, as CloudWatch has done since 2019
    assert _triples(_all(endpoint, page_size=5, interleaved=False)[0]) == two_jobs.expected

    # the unfinished line becomes an event once whole, at its place in the order
    with open(two_jobs.root / "alpha" / "attempt-2" / "algo-1" / "logs" / "node.log", "a") as f:
        f.write(" now whole\n")
    after = _triples(_all(endpoint, page_size=3)[0])
    assert after == two_jobs.expected + [(two_jobs.alpha1, int((T0 + 10) * 1000), "a2h1 unfinished now whole")]


def test_a_token_resumes_exactly_and_belongs_to_its_query(endpoint, two_jobs):
    first = endpoint.logs.filter_log_events(logGroupName=GROUP, limit=5)
    token = first["nextToken"]
    again = [endpoint.logs.filter_log_events(logGroupName=GROUP, limit=5, nextToken=token) for _ in range(2)]
    assert _triples(again[0]["events"]) == _triples(again[1]["events"]) == two_jobs.expected[5:10]
    assert [e["eventId"] for e in again[0]["events"]] == [e["eventId"] for e in again[1]["events"]]
    assert again[0]["nextToken"] == again[1]["nextToken"] != token
    rest = endpoint.logs.filter_log_events(logGroupName=GROUP, limit=100, nextToken=again[0]["nextToken"])
    assert _triples(first["events"] + again[0]["events"] + rest["events"]) == two_jobs.expected
    assert "nextToken" not in rest  # pagination is over
    # exactly full on the last line: no token either (there is nothing after it)
    whole = endpoint.logs.filter_log_events(logGroupName=GROUP, limit=len(two_jobs.expected))
    assert len(whole["events"]) == len(two_jobs.expected) and "nextToken" not in whole

    with pytest.raises(endpoint.logs.exceptions.InvalidParameterException, match="another query"):
        endpoint.logs.filter_log_events(logGroupName=GROUP, limit=5, nextToken=token, filterPattern="line")
    for bad in ("garbage", "eyJ2IjoxfQ", token[:-3]):
        with pytest.raises(endpoint.logs.exceptions.InvalidParameterException, match="nextToken"):
            endpoint.logs.filter_log_events(logGroupName=GROUP, nextToken=bad)


def test_filter_patterns_match_as_cloudwatch_does_and_unsupported_ones_are_refused(endpoint, two_jobs):
    def messages(pattern: str, **args) -> list[str]:
        return [e["message"] for e in _all(endpoint, page_size=2, filterPattern=pattern, **args)[0]]

    everything = [m for _, _, m in two_jobs.expected]
    assert messages("") == messages("   ") == everything
    assert messages("line 0") == ["a1h1 line 0", "a1h2 line 0", "b1h1 line 0", "a2h1 line 0"]  # every term
    assert messages("a1h1 2") == ["a1h1 line 2"]
    assert messages('"h1 line 1"') == ["a1h1 line 1", "b1h1 line 1", "a2h1 line 1"]  # the exact phrase
    assert messages('"line 1 a"') == []
    assert messages('"ERROR:"') == ["b1h1 ERROR: oom"]
    assert messages("error") == []  # case-sensitive
    assert messages("?oom ?a1h2") == ["a1h2 line 0", "a1h2 line 1", "a1h2 line 2", "b1h1 ERROR: oom"]
    assert messages('?"line 3" ?oom') == ["a1h1 line 3", "b1h1 ERROR: oom"]
    assert messages("h1 -a1h1 -a2h1") == ["b1h1 line 0", "b1h1 line 1", "b1h1 ERROR: oom"]
    assert messages("-line") == ["b1h1 ERROR: oom"]
    assert messages("%^a[12]h2 line [0-1]$%") == ["a1h2 line 0", "a1h2 line 1"]
    assert messages("%ERROR|line 3%") == ["a1h1 line 3", "b1h1 ERROR: oom"]
    # filtered out lines still page: a page that scanned its budget without a match has a token
    assert messages("oom", logStreamNamePrefix="beta/") == ["b1h1 ERROR: oom"]

    for pattern, why in [
        ('{ $.level = "ERROR" }', "JSON filter patterns"),
        ("[ip, user, status=4*]", "Space-delimited"),
        ("ERROR:", "double quotes"),
        ("algo-1", "double quotes"),
        ("?ERROR line", "cannot be mixed"),
        ('"unclosed', "not closed"),
        ('"a"b', "followed by a space"),
        ('""', "empty quoted"),
        ("%(a|b)%", "no parentheses"),
        ("%a% b", "one %...% alone"),
        ("%[a%", "Invalid filter pattern"),
    ]:
        with pytest.raises(endpoint.logs.exceptions.InvalidParameterException, match=why):
            endpoint.logs.filter_log_events(logGroupName=GROUP, filterPattern=pattern)


def test_a_page_that_scans_its_budget_stops_early_with_a_token(endpoint, two_jobs, monkeypatch):
    monkeypatch.setattr(logs_api, "FILTER_SCAN_BYTES", 1)  # one line a page (the server runs in this process)
    events, pages = _all(endpoint, filterPattern="oom")
    assert [e["message"] for e in events] == ["b1h1 ERROR: oom"] and pages == len(two_jobs.expected)


def test_start_and_end_time_are_inclusive_milliseconds(endpoint, two_jobs):
    def streams_and_messages(**args) -> list[tuple[str, int, str]]:
        return _triples(_all(endpoint, page_size=3, **args)[0])

    t0, t5, t10 = int(T0 * 1000), int((T0 + 5) * 1000), int((T0 + 10) * 1000)
    assert streams_and_messages(startTime=t5) == two_jobs.expected[7:]
    assert streams_and_messages(startTime=t5 + 1) == two_jobs.expected[10:]
    assert streams_and_messages(endTime=t5) == two_jobs.expected[:10]
    assert streams_and_messages(endTime=t5 - 1) == two_jobs.expected[:7]
    assert streams_and_messages(startTime=t5, endTime=t5) == two_jobs.expected[7:10]
    assert streams_and_messages(startTime=t0 + 1, endTime=t5 - 1) == []
    assert streams_and_messages(startTime=t10 + 1) == []
    with pytest.raises(endpoint.logs.exceptions.InvalidParameterException, match="endTime"):
        endpoint.logs.filter_log_events(logGroupName=GROUP, startTime=t10, endTime=t5)


def test_stream_names_and_prefixes_narrow_the_search(endpoint, two_jobs):
    def streams_of(**args) -> list[tuple[str, int, str]]:
        return _triples(_all(endpoint, page_size=4, **args)[0])

    alpha = [e for e in two_jobs.expected if e[0].startswith("alpha/")]
    assert streams_of(logStreamNamePrefix="alpha/") == streams_of(logStreamNamePrefix="alp") == alpha
    assert streams_of(logStreamNamePrefix="alpha/algo-2") == [e for e in alpha if e[0] == two_jobs.alpha2]
    assert streams_of(logStreamNamePrefix="gamma/") == []
    chosen = [two_jobs.alpha2, two_jobs.beta1]
    assert streams_of(logStreamNames=chosen) == [e for e in two_jobs.expected if e[0] in chosen]
    assert streams_of(logStreamNames=[two_jobs.beta1, "beta/algo-1-1", "nope"]) == two_jobs.expected[7:10]
    with pytest.raises(endpoint.logs.exceptions.InvalidParameterException, match="both"):
        endpoint.logs.filter_log_events(logGroupName=GROUP, logStreamNames=chosen, logStreamNamePrefix="alpha/")


def test_groups_inputs_and_tenants_are_checked_as_cloudwatch_does(endpoint, two_jobs):
    logs = endpoint.logs
    arn = f"arn:aws:logs:{REGION}:{sagemaker_answers.account_id(endpoint.tenant)}:log-group:{GROUP}"
    for identifier in (GROUP, arn, arn + ":*"):
        events = logs.filter_log_events(logGroupIdentifier=identifier)["events"]
        assert _triples(events) == two_jobs.expected
    for unknown in ({"logGroupName": "/aws/lambda/x"}, {"logGroupIdentifier": arn.replace(GROUP, "/aws/x")}):
        with pytest.raises(logs.exceptions.ResourceNotFoundException):
            logs.filter_log_events(**unknown)
    other_account = arn.replace(sagemaker_answers.account_id(endpoint.tenant), "000000000000")
    with pytest.raises(logs.exceptions.ResourceNotFoundException):
        logs.filter_log_events(logGroupIdentifier=other_account)
    # what botocore would refuse before sending, sent anyway: the endpoint refuses it too
    unchecked = _client_without_validation(endpoint)
    for body, why in [
        ({}, "Either logGroupName or logGroupIdentifier"),
        ({"logGroupName": GROUP, "logGroupIdentifier": GROUP}, "cannot both"),
        ({"logGroupName": GROUP, "limit": 0}, "limit"),
        ({"logGroupName": GROUP, "limit": 10001}, "limit"),
        ({"logGroupName": GROUP, "startTime": -1}, "startTime"),
        ({"logGroupName": GROUP, "logStreamNames": []}, "logStreamNames"),
        ({"logGroupName": GROUP, "startFromHead": False}, "startFromHead"),
    ]:
        with pytest.raises(unchecked.exceptions.InvalidParameterException, match=why):
            unchecked.filter_log_events(**body)
    # another tenant sees none of these streams
    other = client("logs", endpoint.url, aws_keys(endpoint.url, endpoint.admin, tenant=endpoint.tenant + "-x"))
    assert other.filter_log_events(logGroupName=GROUP)["events"] == []


def _client_without_validation(endpoint):
    session = boto3.session.Session(
        aws_access_key_id=endpoint.keys[0], aws_secret_access_key=endpoint.keys[1], region_name=REGION
    )
    return session.client(
        "logs", endpoint_url=endpoint.url, config=Config(parameter_validation=False, retries={"max_attempts": 1})
    )


def test_the_pattern_compiler_alone():
    match = compile_filter_pattern
    message = "step 10 loss 2.5 out of memory"
    assert match("")(message) and match("loss")(message) and match("10 loss")(message)
    assert match('"out of memory"')(message) and not match('"memory out"')(message)
    assert match("?nope ?loss")(message) and not match("?nope ?zip")(message)
    assert match("-nope")(message) and not match("loss -memory")(message)
    assert match("%loss [0-9]\\.5%")(message) and not match("%^loss%")(message)
    with pytest.raises(AwsError) as caught:
        match("%a\n%")
    assert caught.value.code == "InvalidParameterException"


# --- the AWS CLI (v1) ------------------------------------------------------------------------------


def _aws(env: dict, *args: str) -> dict:
    aws = Path(sys.executable).parent / "aws"
    assert aws.exists(), "the AWS CLI (awscli, in the dev extra) is not installed beside this Python"
    r = subprocess.run([str(aws), *args, "--output", "json"], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _cli_env(tmp_path: Path, **extra: str) -> dict:
    """The process environment without any AWS setting of this machine's, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env |= {
        "HOME": str(tmp_path / "home"),
        "AWS_CONFIG_FILE": str(tmp_path / "none" / "config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none" / "credentials"),
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    return env | extra


@pytest.mark.slow  # each CLI call is a process that loads the CLI (seconds on a busy machine)
def test_aws_logs_filter_log_events_returns_the_jobs_lines(endpoint, two_jobs, tmp_path):
    env = _cli_env(
        tmp_path,
        AWS_ACCESS_KEY_ID=endpoint.keys[0],
        AWS_SECRET_ACCESS_KEY=endpoint.keys[1],
        AWS_DEFAULT_REGION=REGION,
    )
    # the CLI pages by itself (here 2 events a call) and prints every event
    out = _aws(env, "logs", "filter-log-events", "--log-group-name", GROUP, "--endpoint-url", endpoint.url,
               "--page-size", "2")  # fmt: skip
    assert _triples(out["events"]) == two_jobs.expected
    t5 = str(int((T0 + 5) * 1000))
    args = ["--log-group-name", GROUP, "--log-stream-name-prefix", "beta/", "--start-time", t5, "--end-time", t5]
    out = _aws(env, "logs", "filter-log-events", *args, "--filter-pattern", '"ERROR:"', "--endpoint-url", endpoint.url)
    assert _triples(out["events"]) == [(two_jobs.beta1, int(t5), "b1h1 ERROR: oom")]

    # through a profile whose cloudwatch_logs endpoint is Aerie (no --endpoint-url), as users set it up
    credentials = f"[aerie]\naws_access_key_id = {endpoint.keys[0]}\naws_secret_access_key = {endpoint.keys[1]}\n"
    profile = aws_profile(tmp_path / "aws", credentials, endpoint.url, "http://127.0.0.1:9")
    env = _cli_env(tmp_path) | profile
    out = _aws(env, "logs", "filter-log-events", "--log-group-name", GROUP, "--log-stream-names", two_jobs.alpha2)
    assert [e["message"] for e in out["events"]] == [f"a1h2 line {i}" for i in range(3)]


def test_a_job_started_just_now_is_found_with_a_start_time(endpoint, tmp_path):
    """What `aws logs tail --since` and SDK log followers ask: the lines since a moment."""
    _job(endpoint, "fresh")
    now = time.time()
    _attempt(endpoint, tmp_path, "fresh", 1, "Running", now, {"algo-1": "hello\nworld\n"})
    events = _all(endpoint, startTime=int((now - 60) * 1000), logStreamNamePrefix="fresh/")[0]
    assert [e["message"] for e in events] == ["hello", "world"]


# --- the AWS CLI v2: `aws logs tail` -----------------------------------------------------------------


@pytest.fixture(scope="module")
def aws_v2(request, tmp_path_factory) -> Path:
    """AWS CLI v2's `aws` executable, unpacked from the aws-cdk-asset-awscli-v2 wheel's layer.zip
    (its `awscli/v2/<version>/dist/` folder, 250 MB) into pytest's cache, once per version (into
    the session's temporary folder where the cache is off: `-p no:cacheprovider`)."""
    assert platform.machine() == "x86_64", "the packaged AWS CLI v2 is a Linux x86_64 build"
    dist = importlib.metadata.distribution("aws-cdk-asset-awscli-v2")
    tgz = next((f for f in dist.files or [] if str(f).endswith(".jsii.tgz")), None)
    assert tgz is not None, "aws-cdk-asset-awscli-v2 (in the dev extra) has no asset archive"
    cache_plugin = getattr(request.config, "cache", None)
    cache = cache_plugin.mkdir("aws-cli-v2") if cache_plugin else tmp_path_factory.mktemp("aws-cli-v2")
    target = cache / dist.version
    if not (target / "aws").exists():
        scratch = Path(tempfile.mkdtemp(dir=cache))
        with tarfile.open(str(dist.locate_file(tgz))) as archive:
            member = archive.extractfile("package/lib/layer.zip")
            assert member is not None
            with open(scratch / "layer.zip", "wb") as out:
                shutil.copyfileobj(member, out)
        with zipfile.ZipFile(scratch / "layer.zip") as layer:
            for info in layer.infolist():
                parts = info.filename.split("/")
                mode = info.external_attr >> 16
                if parts[:2] != ["awscli", "v2"] or len(parts) < 5 or parts[3] != "dist" or stat.S_ISLNK(mode):
                    continue
                path = scratch / "dist" / "/".join(parts[4:])
                if info.is_dir():
                    path.mkdir(parents=True, exist_ok=True)
                    continue
                path.parent.mkdir(parents=True, exist_ok=True)
                with layer.open(info) as src, open(path, "wb") as out:
                    shutil.copyfileobj(src, out)
                path.chmod(stat.S_IMODE(mode) or 0o644)
        try:
            (scratch / "dist").rename(target)  # atomic: a concurrent run keeps the first one unpacked
        except OSError:
            assert (target / "aws").exists()
        shutil.rmtree(scratch, ignore_errors=True)
    return target / "aws"


def _untimed(line: str) -> str:
    """A line `aws logs tail` printed, without its leading timestamp."""
    assert line.strip(), "aws logs tail printed nothing more"
    return line.rstrip("\n").split(" ", 1)[1]


@pytest.mark.slow
def test_aws_cli_v2_logs_tail_prints_the_jobs_lines_and_follows_new_ones(endpoint, tmp_path, aws_v2):
    _job(endpoint, "tailed", instances=2)
    started = time.time() - 30
    root = _attempt(
        endpoint, tmp_path, "tailed", 1, "Running", started, {"algo-1": _lines(3, "h1"), "algo-2": "h2 hi\n"}
    )
    env = _cli_env(
        tmp_path,
        AWS_ACCESS_KEY_ID=endpoint.keys[0],
        AWS_SECRET_ACCESS_KEY=endpoint.keys[1],
        AWS_DEFAULT_REGION=REGION,
        AWS_PAGER="",
    )
    tail = [str(aws_v2), "logs", "tail", GROUP, "--endpoint-url", endpoint.url, "--log-stream-name-prefix", "tailed/"]
    r = subprocess.run(
        [*tail, "--since", "5m", "--format", "short"], env=env, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr
    # short: "<timestamp> <message>", every line of both hosts, in the interleaved order
    assert [_untimed(line) for line in r.stdout.splitlines()] == [f"h1 line {i}" for i in range(3)] + ["h2 hi"]
    r = subprocess.run(
        [*tail, "--since", "5m", "--filter-pattern", "?hi ?2"], env=env, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr
    # detailed (the default): "<timestamp> <stream> <message>"
    streams = _streams(endpoint, "tailed/")
    assert [_untimed(line) for line in r.stdout.splitlines()] == [f"{streams[0]} h1 line 2", f"{streams[1]} h2 hi"]
    r = subprocess.run([*tail, "--since", "10s"], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout == "", r.stdout + r.stderr  # the attempt began 30 s ago

    # --follow: new lines appear once each, as they are written
    follow = subprocess.Popen(
        [*tail, "--since", "5m", "--format", "short", "--follow"], env=env, stdout=subprocess.PIPE, text=True
    )
    watchdog = threading.Timer(90, follow.kill)  # a stuck follower ends, and readline() returns ""
    watchdog.start()
    try:
        seen = [_untimed(follow.stdout.readline()) for _ in range(4)]
        assert seen == [f"h1 line {i}" for i in range(3)] + ["h2 hi"]
        with open(root / "algo-1" / "logs" / "node.log", "a") as f:
            f.write("h1 later\n")
        assert _untimed(follow.stdout.readline()) == "h1 later"  # and not the first four again
    finally:
        watchdog.cancel()
        follow.terminate()
        follow.wait(timeout=30)
