"""The dev stack's loopback S3 server: a real moto process, started, reused, paused, stopped."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest

from devtools import devstack
from devtools.devstack import S3Server


def test_start_serves_a_bucket_and_stop_ends_the_process(tmp_path):
    server = S3Server.start(bucket="things", log_path=tmp_path / "moto.log")
    try:
        client = server.client()
        client.put_object(Bucket="things", Key="k", Body=b"v")
        assert client.get_object(Bucket="things", Key="k")["Body"].read() == b"v"
        env = server.env()
        assert env["AERIE_S3_ENDPOINT"] == env["AWS_ENDPOINT_URL"] == server.endpoint_url
        assert env["AWS_REGION"] and env["AWS_ACCESS_KEY_ID"] and env["AWS_SECRET_ACCESS_KEY"]
    finally:
        server.stop()
    assert not server.alive()


def test_env_reaches_a_job_process(tmp_path):
    """A child process given only env() can use the bucket (as a job would)."""
    with S3Server.start() as server:
        code = (
            "import boto3; c = boto3.client('s3'); "
            "c.put_object(Bucket='aerie', Key='from-job', Body=b'hi'); print('ok')"
        )
        env = {**os.environ, **server.env()}
        for var in ("AWS_PROFILE", "AWS_CONFIG_FILE"):
            env.pop(var, None)
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
        assert r.stdout.strip() == "ok", r.stderr
        assert server.client().get_object(Bucket="aerie", Key="from-job")["Body"].read() == b"hi"


def test_pause_makes_an_outage_and_resume_ends_it_without_losing_data():
    with S3Server.start() as server:
        client = server.client()
        client.put_object(Bucket="aerie", Key="k", Body=b"kept")
        server.pause()
        try:
            assert not server.answers(timeout_s=0.5)
        finally:
            server.resume()
        assert server.answers()
        assert client.get_object(Bucket="aerie", Key="k")["Body"].read() == b"kept"


def test_a_request_during_a_pause_completes_after_resume():
    with S3Server.start() as server:
        client = server.client()
        server.pause()
        result = {}
        t = threading.Thread(target=lambda: result.update(r=client.put_object(Bucket="aerie", Key="late", Body=b"x")))
        t.start()
        time.sleep(0.5)
        assert "r" not in result
        server.resume()
        t.join(30)
        assert result["r"]["ResponseMetadata"]["HTTPStatusCode"] == 200


def test_ensure_s3_records_state_and_reuses_the_running_server(aerie_home):
    server = devstack.ensure_s3()
    try:
        state = json.loads((aerie_home / "devstack" / "s3.json").read_text())
        assert state["pid"] == server.pid and state["endpoint_url"] == server.endpoint_url
        again = devstack.ensure_s3(bucket="second")
        assert again.pid == server.pid and not again.owned
        assert {b["Name"] for b in again.client().list_buckets()["Buckets"]} >= {"aerie", "second"}
        # A detached server outlives its starter: it is in a session of its own.
        assert os.getsid(server.pid) == server.pid
    finally:
        S3Server.attach().stop()
    assert not (aerie_home / "devstack" / "s3.json").exists()
    assert S3Server.attach() is None


def test_a_stale_state_file_starts_a_new_server(aerie_home):
    path = aerie_home / "devstack" / "s3.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"pid": 999999, "host": "127.0.0.1", "port": 1, "bucket": "aerie"}))
    server = devstack.ensure_s3()
    try:
        assert server.pid != 999999 and server.answers()
    finally:
        server.stop()


def test_a_server_that_cannot_bind_fails_fast():
    with S3Server.start() as first, pytest.raises((RuntimeError, TimeoutError)):
        S3Server.start(port=first.port, timeout_s=15)


def test_without_moto_aerie_up_and_the_server_say_what_to_install(aerie_home, monkeypatch):
    """moto is not a core dependency (the [stack] extra brings it): without it, `aerie up` on the
    embedded defaults exits before serving, naming the extra (tests/test_install.py checks it in a
    real install without moto), and S3Server.start refuses with the same hint."""
    from typer.testing import CliRunner

    from aerie_contracts import env
    from orchestrator.cli import app

    monkeypatch.setattr(devstack, "missing", lambda: ["moto", "flask"])
    for var in (env.S3_ENDPOINT, "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("COLUMNS", "300")
    r = CliRunner().invoke(app, ["up", "--port", "0"])
    said = " ".join(r.output.split())
    assert r.exit_code == 1, said
    assert "moto, flask missing" in said and "pip install 'aerie[stack]'" in said and "--no-s3" in said
    assert not (aerie_home / "devstack" / "s3.json").exists()
    with pytest.raises(RuntimeError, match=r"aerie\[stack\]"):
        S3Server.start()


# --- the per-connection throttling proxy (devtools/s3proxy.py) -----------------------


def timed_get(endpoint_url: str, key: str) -> tuple[bytes, float]:
    import boto3
    from botocore.config import Config

    client = boto3.client(
        "s3",
        endpoint_url=endpoint_url,
        region_name="us-east-1",
        aws_access_key_id="a",
        aws_secret_access_key="b",
        config=Config(s3={"addressing_style": "path"}),
    )
    t0 = time.monotonic()
    body = client.get_object(Bucket="aerie", Key=key)["Body"].read()
    return body, time.monotonic() - t0


def test_proxy_caps_each_connection(s3_server):
    from devtools.s3proxy import ThrottlingProxy

    data = os.urandom(3 << 20)
    s3_server.client().put_object(Bucket="aerie", Key="proxy-blob", Body=data)
    with ThrottlingProxy("127.0.0.1", s3_server.port, rate=1e6) as proxy:  # 1 MB/s
        body, elapsed = timed_get(proxy.endpoint_url, "proxy-blob")
        assert body == data
        assert elapsed > 0.6 * len(data) / 1e6  # loosely: about 3 s, surely not much faster
        assert proxy.stats.connections >= 1 and proxy.stats.bytes_down >= len(data)
        # Connections have buckets of their own: two at once take about as long as one.
        results = []
        threads = [
            threading.Thread(target=lambda: results.append(timed_get(proxy.endpoint_url, "proxy-blob")))
            for _ in range(2)
        ]
        t0 = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        both = time.monotonic() - t0
        assert [r[0] == data for r in results] == [True, True]
        assert both < 1.7 * elapsed + 1.0


def test_proxy_as_a_separate_process_reports_its_counters(s3_server, tmp_path):
    from devtools.s3proxy import ProxyProcess

    s3_server.client().put_object(Bucket="aerie", Key="small", Body=b"z" * 1000)
    with ProxyProcess("127.0.0.1", s3_server.port, rate=50e6, stats_path=str(tmp_path / "stats.json")) as proxy:
        body, _ = timed_get(proxy.endpoint_url, "small")
        assert body == b"z" * 1000
        stats = proxy.stats()
        assert stats.connections >= 1 and stats.bytes_down >= 1000 and stats.peak_active >= 1
        proxy.reset_peak()
        assert proxy.stats().peak_active == 0


def test_proxy_cut_is_an_outage_and_heal_ends_it(s3_server):
    import boto3
    from botocore.config import Config
    from botocore.exceptions import BotoCoreError, ClientError

    from devtools.s3proxy import ThrottlingProxy

    s3_server.client().put_object(Bucket="aerie", Key="cut", Body=b"still here")
    with ThrottlingProxy("127.0.0.1", s3_server.port, rate=None) as proxy:
        client = boto3.client(
            "s3",
            endpoint_url=proxy.endpoint_url,
            region_name="us-east-1",
            aws_access_key_id="a",
            aws_secret_access_key="b",
            config=Config(
                s3={"addressing_style": "path"}, retries={"max_attempts": 1}, connect_timeout=2, read_timeout=2
            ),
        )
        proxy.cut()
        with pytest.raises((BotoCoreError, ClientError)):
            client.get_object(Bucket="aerie", Key="cut")
        proxy.heal()
        assert client.get_object(Bucket="aerie", Key="cut")["Body"].read() == b"still here"
