"""S3 I/O on the real loopback server: settings, DCP round trips, ranged reads, no disk staging."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from aerie_checkpoint import gc as ckpt_gc
from aerie_checkpoint import manifest
from trainer.checkpoint import s3io

REPO = Path(__file__).resolve().parents[3]


def test_settings_from_env():
    s = s3io.S3Settings.from_env(
        {
            "AERIE_S3_ENDPOINT": "http://127.0.0.1:9000",
            "AWS_ENDPOINT_URL": "http://x:1",
            "AERIE_S3_PART_SIZE": str(16 << 20),
            "AERIE_S3_THROUGHPUT_GBPS": "25",
        }
    )
    assert s.endpoint_url == "http://127.0.0.1:9000" and s.region == "us-east-1"
    assert s.part_size == 16 << 20 and s.throughput_target_gbps == 25.0 and s.path_style
    assert s.read_part_size == 16 << 20  # the default
    assert s3io.S3Settings.from_env({"AERIE_S3_READ_PART_SIZE": "300000"}).read_part_size == 300_000
    aws = s3io.S3Settings.from_env(
        {"AWS_ENDPOINT_URL": "https://s3.eu-west-1.amazonaws.com", "AWS_REGION": "eu-west-1"}
    )
    assert aws.endpoint_url.startswith("https://s3.") and aws.region == "eu-west-1" and not aws.path_style
    assert not s3io.S3Settings.from_env({}).path_style


def test_parse_uri():
    assert s3io.parse_uri("s3://b/k/step_00000001") == ("b", "k/step_00000001")
    assert s3io.parse_uri("s3://b") == ("b", "")
    with pytest.raises(ValueError):
        s3io.parse_uri("/local/path")


def test_boto3_half_and_manifest_import_without_torch(s3_env, s3_bucket):
    code = textwrap.dedent(f"""
        import sys
        class NoTorch:
            def find_spec(self, name, path=None, target=None):
                if name.split('.')[0] in ('torch', 's3torchconnector'):
                    raise ImportError('not here')
        sys.meta_path.insert(0, NoTorch())
        from trainer.checkpoint import s3io
        from aerie_checkpoint import manifest
        c = s3io.boto3_client()
        c.put_object(Bucket='{s3_bucket}', Key='x/step_00000001/a', Body=b'abc')
        manifest.commit('s3://{s3_bucket}/x/step_00000001', step=1)
        print(manifest.last_good('s3://{s3_bucket}/x'))
    """)
    r = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120, env={**os.environ}
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == f"s3://{s3_bucket}/x/step_00000001"


def state_dict(torch, mib: int = 4):
    g = torch.Generator().manual_seed(0)
    n = mib * (1 << 20) // 4 // 4
    return {
        "model": {f"layer{i}.weight": torch.randn(n, generator=g) for i in range(4)},
        "optim": {"step": torch.tensor(7), "lr": 0.1, "betas": [0.9, 0.95]},
        "extra": {"data_position": 12345, "rng": torch.randint(0, 255, (64,), generator=g, dtype=torch.uint8)},
    }


def assert_equal(torch, a, b):
    assert a.keys() == b.keys()
    for k in a:
        if isinstance(a[k], dict):
            assert_equal(torch, a[k], b[k])
        elif isinstance(a[k], torch.Tensor):
            assert torch.equal(a[k], b[k]), k
        else:
            assert a[k] == b[k], k


def empty_like(torch, sd):
    return {
        k: empty_like(torch, v)
        if isinstance(v, dict)
        else (torch.zeros_like(v) if isinstance(v, torch.Tensor) else None)
        for k, v in sd.items()
    }


@pytest.fixture
def torch1():
    torch = pytest.importorskip("torch")
    torch.set_num_threads(1)
    return torch


def test_dcp_round_trip_through_the_loopback_server(torch1, s3_prefix, monkeypatch, s3_server):
    """Only AERIE_S3_ENDPOINT names the server: the writer/reader subclasses bind it."""
    import torch.distributed.checkpoint as dcp

    from devtools.s3proxy import ThrottlingProxy

    torch = torch1
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    with ThrottlingProxy("127.0.0.1", s3_server.port, rate=None) as proxy:  # counts connections
        monkeypatch.setenv("AERIE_S3_ENDPOINT", proxy.endpoint_url)
        sd = state_dict(torch)
        uri = manifest.checkpoint_uri(s3_prefix, 20)
        dcp.save(sd, storage_writer=s3io.storage_writer(uri, thread_count=4))
        m = manifest.commit(uri, step=20)
        assert ".metadata" in [o["key"] for o in m["objects"]]
        assert sum(o["key"].endswith(".distcp") for o in m["objects"]) == 4  # one file per writer thread
        assert manifest.verify(uri, deep=True).good
        saved_conns = proxy.stats.connections
        assert saved_conns > 0  # it really went through our endpoint

        proxy.reset_peak()
        out = empty_like(torch, sd)
        dcp.load(out, storage_reader=s3io.storage_reader(uri, connections=4))
        assert_equal(torch, sd, out)
        assert proxy.stats.peak_active >= 2  # files read in parallel
        assert ckpt_gc.list_incomplete_uploads(s3_prefix) == []


def test_restore_reads_equal_ranged_slices_in_bounded_batches(torch1, s3_prefix, s3_server, monkeypatch):
    """The reader's own read path: a partial load (gaps in the files), several memory-bounded
    batches, and slices smaller than the items."""
    import torch.distributed.checkpoint as dcp

    from devtools.s3proxy import ThrottlingProxy

    torch = torch1
    g = torch.Generator().manual_seed(1)
    sd = {f"w{i}": torch.randn((i + 1) * 50_000, generator=g) for i in range(8)}  # 0.2-1.6 MB each
    uri = manifest.checkpoint_uri(s3_prefix, 1)
    dcp.save(sd, storage_writer=s3io.storage_writer(uri, thread_count=2))
    with ThrottlingProxy("127.0.0.1", s3_server.port, rate=None) as proxy:
        settings = s3io.S3Settings.from_env(
            {**os.environ, "AERIE_S3_ENDPOINT": proxy.endpoint_url, "AERIE_S3_READ_PART_SIZE": str(300_000)}
        )
        wanted = {k: torch.zeros_like(v) for k, v in sd.items() if k in ("w0", "w3", "w4", "w7")}
        reader = s3io.storage_reader(uri, connections=3, settings=settings, buffer_bytes=1 << 20)
        proxy.reset_peak()
        dcp.load(wanted, storage_reader=reader)
        assert all(torch.equal(wanted[k], sd[k]) for k in wanted)
        assert proxy.stats.peak_active >= 2  # slices fetched in parallel


def test_coalesce_merges_small_gaps_only():
    assert s3io._coalesce([(100, 10), (0, 50), (60, 20)], max_gap=10) == [(0, 80), (100, 110)]
    assert s3io._coalesce([(0, 10), (10, 5)], max_gap=0) == [(0, 15)]


def test_dcp_round_trip_on_files(torch1, tmp_path):
    import torch.distributed.checkpoint as dcp

    torch = torch1
    sd = state_dict(torch, mib=1)
    uri = f"file://{tmp_path}/ck/step_00000001"
    dcp.save(sd, storage_writer=s3io.storage_writer(uri, thread_count=2))
    manifest.commit(uri, step=1)
    out = empty_like(torch, sd)
    dcp.load(out, storage_reader=s3io.storage_reader(uri))
    assert_equal(torch, sd, out)
    assert manifest.last_good(f"file://{tmp_path}/ck") == uri


def test_parallel_get_reads_the_whole_object_with_ranged_gets(s3_env, s3_bucket, s3_server, monkeypatch):
    from devtools.s3proxy import ThrottlingProxy

    data = os.urandom(3 << 20) + b"tail"
    s3io.boto3_client().put_object(Bucket=s3_bucket, Key="blob", Body=data)
    with ThrottlingProxy("127.0.0.1", s3_server.port, rate=None) as proxy:
        settings = s3io.S3Settings.from_env({**s3_env, "AERIE_S3_ENDPOINT": proxy.endpoint_url})
        got = s3io.parallel_get(f"s3://{s3_bucket}/blob", connections=4, part_size=256 << 10, settings=settings)
        assert bytes(got) == data
        assert proxy.stats.connections >= 2


SAVE_IN_TMPFS = """
import os, sys, tempfile, torch, torch.distributed.checkpoint as dcp
from trainer.checkpoint import s3io
from aerie_checkpoint import manifest
torch.set_num_threads(1)
assert tempfile.gettempdir() == os.environ["TMPDIR"], tempfile.gettempdir()
# Control: a whole-file staging of this state would not fit in the temp dir.
try:
    with tempfile.TemporaryFile() as f:
        f.write(b"x" * (40 << 20)); f.flush(); os.fsync(f.fileno())
    sys.exit("the temp dir is not small")
except OSError:
    pass
sd = {f"w{i}": torch.randn(10 << 20 >> 2) for i in range(4)}  # 40 MiB, files of 20 MiB
uri = sys.argv[1]
dcp.save(sd, storage_writer=s3io.storage_writer(uri, thread_count=2))
manifest.commit(uri, step=1)
out = {k: torch.empty_like(v) for k, v in sd.items()}
dcp.load(out, storage_reader=s3io.storage_reader(uri))
assert all(torch.equal(out[k], sd[k]) for k in sd)
print("ok", manifest.read_manifest(uri)["total_bytes"])
"""


def test_save_larger_than_the_temp_dir_succeeds(torch1, s3_prefix, tmp_path):
    """Acceptance 3: no whole-file staging. TMPDIR is a 16 MiB tmpfs; the state is 40 MiB."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    small = tmp_path / "small-tmp"
    small.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(small)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        env = {**os.environ, "TMPDIR": str(small), "OMP_NUM_THREADS": "1"}
        uri = manifest.checkpoint_uri(s3_prefix, 1)
        p = subprocess.run(
            [sys.executable, "-c", SAVE_IN_TMPFS, uri], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
        )
        assert p.returncode == 0, p.stdout[-1000:] + p.stderr[-3000:]
        assert p.stdout.split()[0] == "ok" and int(p.stdout.split()[1]) > 40 << 20
        assert manifest.verify(uri).good
    finally:
        subprocess.run(["umount", str(small)], check=False)


def test_an_outage_mid_save_fails_fast_commits_nothing_and_leaves_abortable_uploads(
    torch1, s3_prefix, s3_server, monkeypatch
):
    """The network path cut during a save: DCP raises soon, no manifest, and the multipart
    uploads the CRT could not abort are listed and aborted by the manifest module."""
    import threading

    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    from devtools.s3proxy import ThrottlingProxy

    torch = torch1
    with ThrottlingProxy("127.0.0.1", s3_server.port, rate=1e6) as proxy:
        monkeypatch.setenv("AERIE_S3_ENDPOINT", proxy.endpoint_url)
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint_url)
        monkeypatch.setenv("AERIE_S3_MAX_ATTEMPTS", "2")
        previous = manifest.checkpoint_uri(s3_prefix, 1)
        dcp.save({"w": torch.ones(1000)}, storage_writer=s3io.storage_writer(previous, thread_count=1))
        manifest.commit(previous, step=1)

        sd = {f"w{i}": torch.randn(5 << 20 >> 2) for i in range(8)}  # 40 MiB at 1 MB/s per connection
        uri = manifest.checkpoint_uri(s3_prefix, 2)
        threading.Timer(1.0, proxy.cut).start()
        with pytest.raises(CheckpointException):  # a BaseException in torch's DCP
            dcp.save(sd, storage_writer=s3io.storage_writer(uri, thread_count=4))
        proxy.heal()
        assert manifest.read_manifest(uri) is None
        assert manifest.last_good(s3_prefix) == previous
        left = ckpt_gc.list_incomplete_uploads(s3_prefix)
        aborted = ckpt_gc.abort_incomplete_uploads(s3_prefix)
        # The CRT may still be aborting some of its own uploads in the background once the path is
        # back: whatever it did not, the manifest module lists and aborts, and nothing stays open.
        assert {u["upload_id"] for u in aborted} <= {u["upload_id"] for u in left}
        assert ckpt_gc.list_incomplete_uploads(s3_prefix) == []
