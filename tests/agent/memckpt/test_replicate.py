"""The memory tier, agent side: two real replication servers (processes, TCP on localhost) in a
ring; a node's snapshots replicated, restored from the local copy, else the peer's replica, else
S3; torn transfers and flipped bytes never used. Payloads are random bytes: the agent never reads
them (the trainer's round trip is tests/trainer/checkpoint/test_memory.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from aerie_contracts import env as E
from aerie_contracts import memckpt
from aerie_contracts.checkpoints import memory_uri, step_of_uri
from agent.memckpt import replicate, restore, ring
from agent.memckpt.store import SnapshotStore
from tests.helpers.wait import wait_for

REPO = Path(__file__).resolve().parents[3]
JOB = "job-mem"
KEY_HEX = "5e" * 32  # the attempt's replication key
KEY = bytes.fromhex(KEY_HEX)


def write(root: Path, step: int, rank: int, payload: bytes, *, header_too: bool = True) -> Path:
    """A rank's snapshot as the trainer writes it: payload, then (unless torn) the header."""
    path = memckpt.local_dir(root, JOB) / memckpt.file_name(step, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.write(bytes(memckpt.HEADER_SIZE) + payload)
        f.flush()
        if header_too:
            header = memckpt.Header(JOB, 1, step, rank, len(payload), zlib.crc32(payload))
            memckpt.write_header(f.fileno(), header)
    return path


class Server:
    """`python -m agent.memckpt` in its own process, on a free port."""

    def __init__(self, root: Path, key_hex: str = KEY_HEX) -> None:
        self.root = root
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "agent.memckpt", "--root", str(root)],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, E.MEMORY_CHECKPOINT_KEY: key_hex},
        )
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        assert line.startswith("listening "), line
        host, port = line.split()[1].rsplit(":", 1)
        self.address = (host, int(port))

    def stop(self) -> str:
        """Stop it; returns what it logged."""
        if self.proc.poll() is None:
            self.proc.terminate()
        _, err = self.proc.communicate(timeout=10)
        return err or ""


@pytest.fixture
def nodes(tmp_path):
    """Nodes `a` and `b`, each its own area and server; a sends to b, b to a."""
    servers = {name: Server(tmp_path / name) for name in ("a", "b")}
    yield servers
    for server in servers.values():
        server.stop()


def payload(n: int, seed: int) -> bytes:
    return bytes((i * 31 + seed) % 251 for i in range(n))


def test_ring_order():
    assert replicate.peer_of(["a", "b", "c"], "c") == "a"
    assert replicate.peer_of(["a", "b", "c"], "a") == "b"
    assert replicate.peer_of(["a"], "a") is None
    with pytest.raises(ValueError):
        replicate.peer_of(["a", "b"], "z")


def test_replicate_then_restore_local_then_replica_then_s3(nodes):
    a, b = nodes["a"], nodes["b"]
    blobs = {rank: payload(3 * memckpt.CHUNK + 123, rank) for rank in (0, 1)}
    for rank, blob in blobs.items():
        write(a.root, 10, rank, payload(1000, 9))  # an older step, pruned once 20 is good
        write(a.root, 20, rank, blob)
    write(a.root, 30, 0, payload(500, 7))  # rank 1 has not written step 30 yet: not a checkpoint
    store_a = SnapshotStore(JOB, a.root)
    replicator = ring.Replicator(store_a, node="a", ranks=[0, 1], peer=b.address, peer_node="b", key=KEY)
    done = replicator.tick()
    assert done is not None and done.step == 20 and done.ranks == [0, 1]
    assert replicator.tick() is None  # nothing newer
    store_b = SnapshotStore(JOB, b.root)
    for rank, blob in blobs.items():
        replica = store_b.find(rank, 20, replica_of="a")
        assert replica is not None and memckpt.verify(replica).step == 20
        assert replica.read_bytes()[memckpt.HEADER_SIZE :] == blob
        assert store_a.find(rank, 10) is not None  # 20 is not known good yet: 10 may be the good one
    replicator.good = 20  # the heartbeat's answer: step 20 is good job-wide
    assert replicator.tick() is None
    assert all(store_a.find(rank, 10) is None for rank in blobs)  # older local snapshots pruned
    body = ring.report_body(done, job=JOB, attempt=1, node="a", world_size=4, peer_node="b")
    assert body["tier"] == "memory" and body["uri"] == memory_uri(JOB, 20, 1) and step_of_uri(body["uri"]) == 20

    # Same node: the local copy.
    s3 = "s3://bucket/ck/job-mem/step_00000010/attempt_0001"
    source = restore.resolve(store_a, rank=0, step=20, written_by="a", holder=b.address, s3_uri=s3, key=KEY)
    assert (source.tier, source.skipped) == ("local", [])

    # A replaced node (an empty area): the replica, fetched from b over TCP, verified.
    fresh = SnapshotStore(JOB, a.root.parent / "a2")
    source = restore.resolve(fresh, rank=1, step=20, written_by="a", holder=b.address, s3_uri=s3, key=KEY)
    assert source.tier == "replica" and source.path is not None
    assert source.path.read_bytes()[memckpt.HEADER_SIZE :] == blobs[1]

    # A flipped byte in the replica: detected by its checksum, S3 is next.
    replica = store_b.find(0, 20, replica_of="a")
    assert replica is not None
    data = bytearray(replica.read_bytes())
    data[memckpt.HEADER_SIZE + 5000] ^= 0x40
    replica.write_bytes(bytes(data))
    source = restore.resolve(fresh, rank=0, step=20, written_by="a", holder=b.address, s3_uri=s3, key=KEY)
    assert (source.tier, source.uri) == ("s3", s3)
    assert "no such snapshot" in source.skipped[0] and "CRC" in source.skipped[1]
    assert fresh.find(0, 20) is None  # nothing half-fetched left behind

    # Both copies gone (the holder is down too): S3.
    b.stop()
    source = restore.resolve(fresh, rank=0, step=20, written_by="a", holder=b.address, s3_uri=s3, key=KEY)
    assert source.tier == "s3"


def test_corrupt_local_copy_falls_back_to_the_replica(nodes):
    a, b = nodes["a"], nodes["b"]
    blob = payload(70_000, 3)
    path = write(a.root, 5, 0, blob)
    store_a = SnapshotStore(JOB, a.root)
    assert ring.Replicator(store_a, node="a", ranks=[0], peer=b.address, key=KEY).tick() is not None
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    source = restore.resolve(store_a, rank=0, step=5, written_by="a", holder=b.address, s3_uri=None, key=KEY)
    assert source.tier == "replica" and "CRC" in source.skipped[0]
    assert memckpt.verify(path).step == 5 and path.read_bytes()[memckpt.HEADER_SIZE :] == blob


def test_torn_local_snapshot_is_never_replicated_or_restored(nodes):
    a, b = nodes["a"], nodes["b"]
    write(a.root, 7, 0, payload(2000, 1))
    write(a.root, 8, 0, payload(2000, 2), header_too=False)  # the rank died before the header
    store_a = SnapshotStore(JOB, a.root)
    assert store_a.newest(0) is not None and store_a.newest(0).header.step == 7  # type: ignore[union-attr]
    done = ring.Replicator(store_a, node="a", ranks=[0], peer=b.address, key=KEY).tick()
    assert done is not None and done.step == 7
    s3 = "s3://x/step_00000007"
    source = restore.resolve(store_a, rank=0, step=8, written_by="a", holder=b.address, s3_uri=s3, key=KEY)
    assert source.tier == "s3" and "no header" in source.skipped[0]


# A sender that streams half a snapshot, then waits to be killed (kill -9 mid-replication).
HALF_SENDER = r"""
import socket, sys, time, zlib
from pathlib import Path
from agent.memckpt import auth, replicate
host, port, path, key = sys.argv[1], int(sys.argv[2]), sys.argv[3], bytes.fromhex(sys.argv[4])
data = open(path, "rb").read()
crc = zlib.crc32(data[4096:])
sock = socket.create_connection((host, port))
mac = auth.verify_and_mac(Path(path), key)[1]
name = path.rsplit("/", 1)[1]
line = {"op": "put", "job": "job-mem", "node": "a", "name": name, "size": len(data), "crc32": crc, "mac": mac}
replicate._request(sock, sock.makefile("rb"), key, line)
sock.sendall(data[: len(data) // 2])
print("sent", flush=True)
time.sleep(60)
"""


def test_replication_killed_mid_copy_leaves_no_replica(nodes):
    a, b = nodes["a"], nodes["b"]
    path = write(a.root, 12, 0, payload(4 * memckpt.CHUNK, 5))
    sender = subprocess.Popen(
        [sys.executable, "-c", HALF_SENDER, b.address[0], str(b.address[1]), str(path), KEY_HEX],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert sender.stdout is not None and sender.stdout.readline().strip() == "sent"
    partial = memckpt.replica_dir(b.root, JOB, "a") / (memckpt.file_name(12, 0) + memckpt.PARTIAL)
    wait_for(partial.exists, timeout_s=10, what="the receiver's partial file")
    os.kill(sender.pid, signal.SIGKILL)
    sender.wait(timeout=10)
    wait_for(lambda: not partial.exists(), timeout_s=10, what="the broken transfer cleaned up")
    store_b = SnapshotStore(JOB, b.root)
    assert store_b.newest(0, replica_of="a") is None
    fresh = SnapshotStore(JOB, a.root.parent / "a2")
    source = restore.resolve(fresh, rank=0, step=12, written_by="a", holder=b.address, s3_uri="s3://x", key=KEY)
    assert source.tier == "s3" and "no such snapshot" in source.skipped[1]
