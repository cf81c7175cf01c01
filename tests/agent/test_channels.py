"""Input channels arriving on a node, against the loopback S3 server, requests counted there.

`agent.channels.receive` runs as the agent runs it (the node contract written by NodeContract,
its environment), with a per-host cache of the test's own. A "relaunch" is a new node directory
on the same host with the same cache, which is what the chain's next attempt is on the local and
Slurm backends.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from aerie_contracts.container import NodeContract
from aerie_s3.clients import boto3_client
from agent.channels import InputUnavailable, receive, relative_path, share
from agent.identity import resolve_identity
from agent.toolkit_env import trainer_env

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def bucket(counting_s3, monkeypatch):
    return counting_s3.fresh_bucket(monkeypatch.setenv)


def _node(root: Path, channels: dict, host: str = "algo-1", hosts=("algo-1",), cache: Path | None = None):
    contract = NodeContract(ml_root=root / host, hosts=tuple(hosts), current_host=host, channels=channels)
    contract.write()
    env = {**os.environ, **contract.env()}
    if cache is not None:
        env["AERIE_CHANNEL_CACHE"] = str(cache)
    return contract, env


def _files(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def _put(bucket: str, objects: dict[str, bytes]) -> None:
    s3 = boto3_client()
    for key, body in objects.items():
        s3.put_object(Bucket=bucket, Key=key, Body=body)


def test_keys_land_at_their_path_below_the_prefix():
    assert relative_path("data/train/", "data/train/a/x.bin") == "a/x.bin"
    assert relative_path("data/train", "data/train/a/x.bin") == "a/x.bin"
    assert relative_path("data/train", "data/train.bin") == "train.bin"
    assert relative_path("data/corpus_text_document.idx", "data/corpus_text_document.idx") == (
        "corpus_text_document.idx"
    )
    assert relative_path("", "top.txt") == "top.txt"
    assert relative_path("d/", "d//x") == "x"
    with pytest.raises(ValueError):
        relative_path("d/", "d/../../etc/passwd")


def test_sharded_by_s3_key_gives_every_nth_key_to_each_node():
    keys = [f"k{i}" for i in range(7)]
    hosts = ("a", "b", "c")
    shares = [share(keys, hosts, h, "ShardedByS3Key") for h in hosts]
    assert shares == [["k0", "k3", "k6"], ["k1", "k4"], ["k2", "k5"]]
    assert share(keys, hosts, "b", "FullyReplicated") == keys


def test_file_mode_downloads_once_per_host_and_a_relaunch_downloads_nothing(bucket, counting_s3, tmp_path):
    data = {
        "ds/corpus_text_document.bin": os.urandom(3 << 20),
        "ds/corpus_text_document.idx": os.urandom(5000),
        "ds/extra/notes.txt": b"notes",
    }
    _put(bucket, data)
    channels = {"train": {"s3_uri": f"s3://{bucket}/ds/", "mode": "File"}}
    cache = tmp_path / "cache"

    # Two nodes of one job on this host (the local backend) at once: each object is fetched once.
    mark = counting_s3.mark()
    nodes = [_node(tmp_path / "attempt-1", channels, h, ("algo-1", "algo-2"), cache) for h in ("algo-1", "algo-2")]
    records = [None, None]

    def run(i):
        contract, env = nodes[i]
        records[i] = receive(contract.ml_root, env, contract.hosts, contract.current_host)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    expected = {k.removeprefix("ds/"): v for k, v in data.items()}
    for contract, _ in nodes:
        assert _files(contract.ml_root / "input" / "data" / "train") == expected
    gets = counting_s3.object_gets(bucket, mark)
    assert set(gets) == set(data) and gets["ds/extra/notes.txt"] == 1 and gets["ds/corpus_text_document.idx"] == 1
    assert sorted(r["channels"]["train"]["downloaded_objects"] for r in records) == [0, 3]
    first = next(r for r in records if r["bytes"])
    assert first["bytes"] == sum(map(len, data.values())) and first["seconds"] >= 0
    assert first["channels"]["train"]["verified"] == {"CRC32": 3}

    # Relaunch on the same host (attempt 2: new node directories, same cache): no GET at all.
    mark = counting_s3.mark()
    contract, env = _node(tmp_path / "attempt-2", channels, cache=cache)
    record = receive(contract.ml_root, env, contract.hosts, contract.current_host)
    assert _files(contract.ml_root / "input" / "data" / "train") == expected
    assert counting_s3.object_gets(bucket, mark) == {}
    assert not [r for r in counting_s3.requests(mark) if r[0] == "HEAD"]
    assert record["bytes"] == 0 and record["cached_bytes"] == sum(map(len, data.values()))
    # An in-place restart (the same node directory again): nothing fetched, the links stay.
    receive(contract.ml_root, env, contract.hosts, contract.current_host)
    assert counting_s3.object_gets(bucket, mark) == {}
    assert _files(contract.ml_root / "input" / "data" / "train") == expected

    # One object changes (a new ETag): only it is fetched again, and the cache keeps one version.
    _put(bucket, {"ds/extra/notes.txt": b"new notes"})
    mark = counting_s3.mark()
    contract, env = _node(tmp_path / "attempt-3", channels, cache=cache)
    record = receive(contract.ml_root, env, contract.hosts, contract.current_host)
    assert counting_s3.object_gets(bucket, mark) == {"ds/extra/notes.txt": 1}
    assert (contract.ml_root / "input" / "data" / "train" / "extra" / "notes.txt").read_bytes() == b"new notes"
    assert record["channels"]["train"]["downloaded_objects"] == 1
    assert len([p for p in (cache / "objects").rglob("*") if p.is_file() and p.suffix != ".json"]) == 3

    # The channel files are hard links to the cache: no second copy on disk.
    idx = contract.ml_root / "input" / "data" / "train" / "corpus_text_document.idx"
    assert idx.stat().st_nlink >= 2


def test_sharded_channel_and_fastfile_channel(bucket, counting_s3, tmp_path):
    _put(bucket, {f"shards/part-{i}.jsonl": f"shard {i}".encode() for i in range(5)})
    _put(bucket, {"stream/a.bin": b"a" * 100})
    channels = {
        "shards": {"s3_uri": f"s3://{bucket}/shards", "mode": "File", "distribution": "ShardedByS3Key"},
        "stream": {"s3_uri": f"s3://{bucket}/stream/", "mode": "FastFile"},
    }
    got = {}
    mark = counting_s3.mark()
    for host in ("node1", "node2"):
        contract, env = _node(tmp_path, channels, host, ("node1", "node2"), tmp_path / "cache")
        assert env["SM_CHANNEL_STREAM_S3_URI"] == f"s3://{bucket}/stream/"
        record = receive(contract.ml_root, env, contract.hosts, contract.current_host)
        got[host] = _files(contract.ml_root / "input" / "data" / "shards")
        assert _files(contract.ml_root / "input" / "data" / "stream") == {}
        assert record["channels"]["stream"] == {"uri": f"s3://{bucket}/stream/", "mode": "FastFile"}
        config = json.loads((contract.ml_root / "input" / "config" / "inputdataconfig.json").read_text())
        assert config["shards"]["S3DistributionType"] == "ShardedByS3Key"
        assert config["stream"]["TrainingInputMode"] == "FastFile"
    assert sorted(got["node1"]) == ["part-0.jsonl", "part-2.jsonl", "part-4.jsonl"]
    assert sorted(got["node2"]) == ["part-1.jsonl", "part-3.jsonl"]
    assert "stream/a.bin" not in counting_s3.object_gets(bucket, mark)


@pytest.mark.parametrize(
    "uri, problem",
    [
        ("s3://{bucket}/missing/", "no objects under the prefix"),
        ("s3://no-such-bucket-{bucket}/x/", "NoSuchBucket"),
    ],
)
@pytest.mark.parametrize("mode", ["File", "FastFile"])
def test_a_missing_prefix_or_bucket_is_input_unavailable_naming_channel_and_prefix(
    bucket, tmp_path, uri, problem, mode
):
    uri = uri.format(bucket=bucket)
    contract, env = _node(tmp_path, {"train": {"s3_uri": uri, "mode": mode}}, cache=tmp_path / "cache")
    with pytest.raises(InputUnavailable) as err:
        receive(contract.ml_root, env, contract.hosts, contract.current_host)
    reason = err.value.reason("algo-1")
    assert reason["kind"] == "input.unavailable" and reason["channel"] == "train" and reason["prefix"] == uri
    assert "'train'" in reason["message"] and uri in reason["message"] and problem in reason["message"]


def test_a_key_that_would_escape_the_channel_directory_is_refused(bucket, tmp_path):
    _put(bucket, {"evil/../../outside": b"x"})
    contract, env = _node(tmp_path, {"c": f"s3://{bucket}/evil/"}, cache=tmp_path / "cache")
    with pytest.raises(InputUnavailable, match="no safe path"):
        receive(contract.ml_root, env, contract.hosts, contract.current_host)
    assert not (tmp_path / "outside").exists()


def test_without_a_cache_objects_go_straight_into_the_channel(bucket, tmp_path):
    _put(bucket, {"plain/x.txt": b"x"})
    contract, env = _node(tmp_path, {"c": f"s3://{bucket}/plain/"})
    env["AERIE_CHANNEL_CACHE"] = "off"
    receive(contract.ml_root, env, contract.hosts, contract.current_host)
    assert _files(contract.ml_root / "input" / "data" / "c") == {"x.txt": b"x"}


def test_the_agent_fails_before_any_rank_starts_when_a_channel_is_missing(bucket, tmp_path):
    """The real agent process chain (entrypoint -> agent): no rank ever runs, the node's outcome
    names the channel and the prefix, and the container's failure file says input.unavailable."""
    uri = f"s3://{bucket}/nothing-here/"
    contract, env = _node(tmp_path, {"train": uri}, cache=tmp_path / "cache")
    marker = tmp_path / "rank-ran"
    env.update(
        {
            "AERIE_ENTRYPOINT": json.dumps(["python", "-c", f"open({str(marker)!r}, 'w')"]),
            "AERIE_WORKDIR": str(REPO),
            "AERIE_HEALTH": json.dumps({"startup_grace_s": 600}),
        }
    )
    r = subprocess.run(
        [sys.executable, "-m", "agent.entrypoint"], env=env, cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 2, r.stdout + r.stderr
    assert not marker.exists() and not list((contract.node_dir / "ranks").iterdir())
    outcome = json.loads((contract.node_dir / "exit.json").read_text())
    assert outcome["reason"]["kind"] == "input.unavailable"
    assert outcome["reason"]["channel"] == "train" and outcome["reason"]["prefix"] == uri
    assert (contract.ml_root / "output" / "failure").read_text().startswith("input.unavailable: input channel 'train'")
    assert uri in r.stderr


def test_a_local_path_channel_is_linked_in_place_and_needs_no_download(tmp_path):
    source = tmp_path / "datasets" / "local"
    source.mkdir(parents=True)
    (source / "a.bin").write_bytes(b"abc")
    single = tmp_path / "one.txt"
    single.write_text("one")
    contract, env = _node(tmp_path, {"dir": str(source), "file": f"file://{single}"}, cache=tmp_path / "cache")
    data = contract.ml_root / "input" / "data"
    assert (data / "dir").resolve() == source and _files(data / "dir") == {"a.bin": b"abc"}
    assert (data / "file" / "one.txt").read_text() == "one"
    ranks = trainer_env(resolve_identity(env), env)  # what the agent gives its ranks
    assert "SM_CHANNEL_DIR_S3_URI" not in env and ranks["SM_CHANNEL_DIR"] == str(data / "dir")
    assert receive(contract.ml_root, env, contract.hosts, contract.current_host)["channels"] == {}


def test_a_stop_request_during_the_download_ends_the_node_at_once(bucket, counting_s3, tmp_path):
    """SIGTERM to the real agent while it downloads through a slow link (the throttling proxy):
    the node ends as a user stop once the slices in flight land (the CRT hands over whole parts)
    without starting the others, no rank starts, and nothing half-written is left."""
    from devtools.s3proxy import ThrottlingProxy

    _put(bucket, {"slow/blob.bin": os.urandom(8 << 20)})  # 8 slices of 1 MiB over 2 connections, ~1 s each
    server = counting_s3.server
    with ThrottlingProxy(server.host, server.port, rate=1e6) as proxy:  # 1 MB/s per connection
        uri = f"s3://{bucket}/slow/"
        contract, env = _node(tmp_path, {"train": uri}, cache=tmp_path / "cache")
        marker = tmp_path / "rank-ran"
        env.update(
            {
                "AERIE_S3_ENDPOINT": proxy.endpoint_url,
                "AWS_ENDPOINT_URL": proxy.endpoint_url,
                "AERIE_S3_CONNECTIONS": "2",
                "AERIE_S3_READ_PART_SIZE": str(1 << 20),
                "AERIE_ENTRYPOINT": json.dumps(["python", "-c", f"open({str(marker)!r}, 'w')"]),
                "AERIE_WORKDIR": str(REPO),
            }
        )
        proc = subprocess.Popen(
            [sys.executable, "-m", "agent.entrypoint"], env=env, cwd=REPO, stderr=subprocess.PIPE, text=True
        )
        log = ""
        for line in proc.stderr:  # wait until the download has begun
            log += line
            if "downloading 1 (8.0 MiB)" in line:
                break
        time.sleep(1.5)  # two slices landed, two in flight, four not started
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        log += proc.communicate(timeout=30)[1]
        assert time.monotonic() - t0 < 10, log
    assert proc.returncode == 143, log
    assert json.loads((contract.node_dir / "exit.json").read_text())["reason"]["kind"] == "user.stop"
    assert not marker.exists()
    assert _files(contract.ml_root / "input" / "data" / "train") == {}
    assert not [p for p in (tmp_path / "cache" / "objects").rglob("*") if p.is_file()]
