"""Replication is scoped to the attempt (agent/memckpt/auth.py, replicate.py): a request without a proof
made with the attempt's key is refused and logged (the key never is), an answer without one is
not believed, and an in-place switch retires the last attempt's key. Real servers on TCP."""

from __future__ import annotations

import json
import logging
import socket
import threading
import zlib

import pytest

from aerie_contracts import memckpt
from agent.memckpt import replicate, restore, ring, wire
from agent.memckpt.store import SnapshotStore
from tests.agent.memckpt.test_replicate import JOB, KEY, KEY_HEX, Server, payload, write

OTHER = bytes.fromhex("a7" * 32)  # another attempt's key


@pytest.fixture
def server(tmp_path):
    s = Server(tmp_path / "b")
    yield s
    s.stop()


def test_a_put_with_another_attempts_key_is_refused_and_logged_without_the_key(tmp_path, server):
    path = write(tmp_path / "a", 4, 0, payload(3 * memckpt.CHUNK, 1))
    with pytest.raises(replicate.ReplicationError):
        replicate.send_snapshot(server.address, path, job=JOB, node="a", key=OTHER)
    assert SnapshotStore(JOB, server.root).newest(0, replica_of="a") is None
    folder = memckpt.replica_dir(server.root, JOB, "a")
    assert not folder.exists() or not list(folder.iterdir())  # not even a partial
    # The right key still works afterwards.
    replicate.send_snapshot(server.address, path, job=JOB, node="a", key=KEY)
    assert SnapshotStore(JOB, server.root).newest(0, replica_of="a") is not None
    logged = server.stop()
    assert "refused a replication request (op 'put'" in logged
    assert KEY_HEX not in logged and OTHER.hex() not in logged


def test_a_request_without_any_proof_is_refused(tmp_path, server):
    """What any process that can connect could send before: the old protocol's bare request."""
    write(tmp_path / "a", 4, 0, payload(1000, 1))
    replicate.send_snapshot(
        server.address, memckpt.local_dir(tmp_path / "a", JOB) / memckpt.file_name(4, 0), job=JOB, node="a", key=KEY
    )
    with socket.create_connection(server.address, timeout=10) as sock:
        stream = sock.makefile("rb")
        assert "challenge" in json.loads(stream.readline())
        sock.sendall(json.dumps({"op": "get", "job": JOB, "node": "a", "rank": 0, "step": 4}).encode() + b"\n")
        answer = json.loads(stream.readline())
        assert answer == {"ok": False, "error": replicate.REFUSED}
        assert stream.read() == b""  # closed: not a byte of the snapshot
    logged = server.stop()
    assert "refused a replication request (op 'get'" in logged


def test_a_fetch_with_another_key_gets_nothing_and_the_restore_falls_back(tmp_path, server):
    path = write(tmp_path / "a", 6, 1, payload(5000, 2))
    assert ring.Replicator(SnapshotStore(JOB, tmp_path / "a"), node="a", ranks=[1], peer=server.address, key=KEY).tick()
    path.unlink()
    fresh = SnapshotStore(JOB, tmp_path / "a2")
    source = restore.resolve(fresh, rank=1, step=6, written_by="a", holder=server.address, s3_uri="s3://x", key=OTHER)
    assert source.tier == "s3" and "refused" in source.skipped[-1]
    assert fresh.find(1, 6) is None
    source = restore.resolve(fresh, rank=1, step=6, written_by="a", holder=server.address, s3_uri="s3://x", key=KEY)
    assert source.tier == "replica"


def test_an_answer_not_proven_with_the_key_is_not_believed(tmp_path):
    """A process holding the port but not the key (a stale or foreign endpoint) cannot pass off a
    snapshot as the replica: its answer's proof fails, nothing is written."""
    snap = write(tmp_path / "x", 3, 0, payload(2000, 5)).read_bytes()
    listener = socket.create_server(("127.0.0.1", 0))

    def impostor() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.sendall(b'{"challenge": "00"}\n')
            conn.makefile("rb").readline()
            crc = memckpt.Header.decode(snap[: memckpt.HEADER_SIZE]).crc32
            answer = {"ok": True, "size": len(snap), "crc32": crc, "proof": "0" * 64}
            conn.sendall(json.dumps(answer).encode() + b"\n" + snap)

    thread = threading.Thread(target=impostor, daemon=True)
    thread.start()
    dest = tmp_path / "dest" / memckpt.file_name(3, 0)
    with pytest.raises(replicate.Unauthenticated):
        replicate.fetch_snapshot(listener.getsockname(), dest, job=JOB, node="a", rank=0, step=3, key=KEY)
    thread.join(timeout=10)
    listener.close()
    assert not dest.exists()


def test_switching_keys_retires_the_last_attempts(tmp_path, caplog):
    srv = replicate.ReplicaServer(tmp_path / "b", key=KEY).start()
    try:
        path = write(tmp_path / "a", 9, 0, payload(4000, 3))
        replicate.send_snapshot(srv.address, path, job=JOB, node="a", key=KEY)
        srv.set_key(OTHER)  # attempt N+1
        refused = pytest.raises(replicate.ReplicationError)
        with caplog.at_level(logging.WARNING, logger="aerie.agent.memckpt"), refused:
            replicate.send_snapshot(srv.address, path, job=JOB, node="a", key=KEY)
        assert srv.refused == 1 and "refused a replication request" in caplog.text
        assert KEY_HEX not in caplog.text
        dest = tmp_path / "c" / memckpt.file_name(9, 0)
        assert replicate.fetch_snapshot(srv.address, dest, job=JOB, node="a", rank=0, step=9, key=OTHER).step == 9
    finally:
        srv.close()


def test_keys_are_checked():
    assert memckpt.parse_key(memckpt.new_key()) and len(memckpt.new_key()) == 64
    with pytest.raises(ValueError, match="not hex") as err:
        memckpt.parse_key("zz-secret-zz")
    assert "secret" not in str(err.value)
    with pytest.raises(ValueError, match="at least 16"):
        memckpt.parse_key("ab" * 8)


# XORed into equal-length bytes this leaves a CRC-32 unchanged: the generator polynomial itself,
# in zlib's bit order (x^32 first, then 0xEDB88320 low bit first). CRC is linear; a MAC is not.
_CRC_NEUTRAL = (0x1DB710641).to_bytes(5, "little")


def _tampering_proxy(upstream: tuple[str, int], at: int, *, answer: bool = False):
    """A man in the middle: relays one connection both ways and XORs `_CRC_NEUTRAL` into one
    direction's stream `at` bytes after its JSON lines (inside the snapshot's bytes): the
    client's (a put's request line), or with `answer` the server's (challenge, answer)."""
    listener = socket.create_server(("127.0.0.1", 0))

    def relay() -> None:
        conn, _ = listener.accept()
        with conn, socket.create_connection(upstream) as up:
            down = threading.Thread(target=_pump, args=(up, conn, at if answer else None, 2), daemon=True)
            down.start()
            _pump(conn, up, None if answer else at, 1)
            down.join(timeout=10)

    thread = threading.Thread(target=relay, daemon=True)
    thread.start()
    return listener, thread


def _pump(src: socket.socket, dst: socket.socket, tamper_at: int | None, lines: int) -> None:
    seen, body = bytearray(), None
    while data := src.recv(1 << 16):
        start = len(seen)
        seen += data
        if tamper_at is not None and body is None and seen.count(b"\n") >= lines:
            body = [i for i, c in enumerate(seen) if c == ord("\n")][lines - 1] + 1
        if tamper_at is not None and body is not None:
            edited = bytearray(data)
            for i, b in enumerate(_CRC_NEUTRAL):
                pos = body + tamper_at + i - start
                if 0 <= pos < len(edited):
                    edited[pos] ^= b
            data = bytes(edited)
        try:
            dst.sendall(data)
        except OSError:
            return
    try:
        dst.shutdown(socket.SHUT_WR)
    except OSError:
        pass


def test_a_replica_tampered_in_flight_with_its_crc_kept_is_refused(tmp_path):
    """The CRC-32 catches accidents only; the payload MAC catches a rewrite that keeps it, on a
    put (no replica counts) and on a restore's fetch (nothing is restored)."""
    srv = replicate.ReplicaServer(tmp_path / "b", key=KEY).start()
    try:
        data = payload(3 * memckpt.CHUNK, 7)
        path = write(tmp_path / "a", 5, 0, data)
        offset = memckpt.CHUNK + 11
        listener, thread = _tampering_proxy(srv.address, memckpt.HEADER_SIZE + offset)
        with pytest.raises(replicate.ReplicationError, match=r"TamperedSnapshot: .*payload MAC"):
            replicate.send_snapshot(listener.getsockname(), path, job=JOB, node="a", key=KEY)
        thread.join(timeout=10)
        listener.close()
        assert SnapshotStore(JOB, srv.root).newest(0, replica_of="a") is None
        assert not list(memckpt.replica_dir(srv.root, JOB, "a").glob("*"))  # not even a partial
        # The edit really kept the CRC-32: only the MAC told it apart.
        tampered = bytearray(data)
        for i, b in enumerate(_CRC_NEUTRAL):
            tampered[offset + i] ^= b
        assert tampered != data and zlib.crc32(tampered) == zlib.crc32(data)

        replicate.send_snapshot(srv.address, path, job=JOB, node="a", key=KEY)  # untampered: stored
        assert SnapshotStore(JOB, srv.root).newest(0, replica_of="a") is not None
        dest = tmp_path / "c" / memckpt.file_name(5, 0)
        listener, thread = _tampering_proxy(srv.address, memckpt.HEADER_SIZE + offset, answer=True)
        with pytest.raises(wire.TamperedSnapshot):
            replicate.fetch_snapshot(listener.getsockname(), dest, job=JOB, node="a", rank=0, step=5, key=KEY)
        thread.join(timeout=10)
        listener.close()
        assert not dest.exists() and not list(dest.parent.glob("*"))
        assert replicate.fetch_snapshot(srv.address, dest, job=JOB, node="a", rank=0, step=5, key=KEY).step == 5
    finally:
        srv.close()
