"""Replication of snapshots between node agents, over TCP: a ring, node i -> node (i+1) mod n.

Wire protocol (one request per connection): a JSON line, then raw bytes where it says so, then a
JSON line back.

- `{"op": "put", "job", "node", "name", "size"}` + `size` bytes (the snapshot file: header block,
  then payload) -> `{"ok": true}` once the receiver stored it complete as a replica of `node`, or
  `{"ok": false, "error"}`. The receiver streams the payload in chunks into a `.partial` file of
  its shared-memory area, computing the payload's CRC-32 as it goes, and only when every byte
  arrived and the CRC matches the header does it write the header block and rename the file: a
  transfer cut short (a killed sender, a dropped link) leaves a partial without a header, never a
  replica.
- `{"op": "get", "job", "node", "rank", "step", "tier"}` (`tier`: `replica` — the copy this
  server holds of `node`'s snapshot — or `local`, its own) -> `{"ok": true, "size"}` + the file's
  bytes, or `{"ok": false, "error"}`. The fetching side verifies before it uses them.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import socketserver
import threading
import zlib
from pathlib import Path
from typing import Any

from aerie_contracts import memckpt
from agent.memckpt.store import SnapshotStore

log = logging.getLogger("aerie.agent.memckpt")

MAX_LINE = 64 * 1024
TIMEOUT_S = 30.0


class ReplicationError(Exception):
    """The peer refused the transfer, or the connection failed."""


def peer_of(nodes: list[str], node: str) -> str | None:
    """Where `node` sends its snapshots: the next node in the attempt's ring (None alone)."""
    if node not in nodes:
        raise ValueError(f"node {node!r} is not one of the attempt's nodes {nodes}")
    return None if len(nodes) < 2 else nodes[(nodes.index(node) + 1) % len(nodes)]


def holder_of(nodes: list[str], node: str) -> str | None:
    """Which node holds `node`'s replicas: its successor in the ring."""
    return peer_of(nodes, node)


# --- framing ----------------------------------------------------------------------------------------


def _send_line(sock: socket.socket, obj: dict[str, Any]) -> None:
    sock.sendall(json.dumps(obj).encode() + b"\n")


def _read_line(stream) -> dict[str, Any]:
    line = stream.readline(MAX_LINE + 1)
    if not line.endswith(b"\n"):
        raise ReplicationError("connection closed or line too long")
    value = json.loads(line)
    if not isinstance(value, dict):
        raise ReplicationError("a JSON object was expected")
    return value


def _read_exact(stream, n: int) -> bytes:
    data = stream.read(n)
    if len(data) != n:
        raise ReplicationError(f"connection closed after {len(data)} of {n} bytes")
    return data


def _receive_file(stream, size: int, final: Path) -> memckpt.Header:
    """`size` bytes of a snapshot file into `final` (via a partial; header last), CRC checked."""
    if size < memckpt.HEADER_SIZE:
        raise ReplicationError(f"a snapshot of {size} bytes has no header")
    header = memckpt.Header.decode(_read_exact(stream, memckpt.HEADER_SIZE))
    if header.size != size - memckpt.HEADER_SIZE:
        raise ReplicationError(f"header says {header.size} payload bytes, the sender {size - memckpt.HEADER_SIZE}")
    final.parent.mkdir(parents=True, exist_ok=True)
    partial = final.with_name(final.name + memckpt.PARTIAL)
    try:
        with open(partial, "wb") as f:
            f.write(b"\0" * memckpt.HEADER_SIZE)
            crc, left = 0, header.size
            while left > 0:
                chunk = stream.read(min(memckpt.CHUNK, left))
                if not chunk:
                    raise ReplicationError(f"connection closed with {left} payload bytes to go")
                crc = zlib.crc32(chunk, crc)
                f.write(chunk)
                left -= len(chunk)
            if crc != header.crc32:
                raise memckpt.CorruptSnapshot(f"received payload CRC-32 {crc:08x}, header says {header.crc32:08x}")
            f.flush()
            memckpt.write_header(f.fileno(), header)
        os.replace(partial, final)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    return header


def _send_file(sock: socket.socket, path: Path) -> None:
    with open(path, "rb") as f:
        sock.sendfile(f)


# --- server -----------------------------------------------------------------------------------------


class _Handler(socketserver.StreamRequestHandler):
    server: ReplicaServer

    def handle(self) -> None:
        self.connection.settimeout(TIMEOUT_S)
        try:
            request = _read_line(self.rfile)
            op = request.get("op")
            if op == "put":
                self._put(request)
            elif op == "get":
                self._get(request)
            else:
                _send_line(self.connection, {"ok": False, "error": f"unknown op {op!r}"})
        except Exception as exc:  # a bad request or a broken transfer: tell the peer if it listens
            log.warning("replication request failed: %s", exc)
            try:
                _send_line(self.connection, {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:500]})
            except OSError:
                pass

    def _store(self, request: dict[str, Any]) -> SnapshotStore:
        return SnapshotStore(str(request.get("job", "")), self.server.root)

    def _put(self, request: dict[str, Any]) -> None:
        store = self._store(request)
        node = memckpt.safe_name(str(request.get("node", "")), "node")
        parsed = memckpt.parse_name(str(request.get("name", "")))
        if parsed is None:
            raise ReplicationError(f"not a snapshot name: {request.get('name')!r}")
        rank, step = parsed
        final = store.dir(replica_of=node) / memckpt.file_name(step, rank)
        header = _receive_file(self.rfile, int(request["size"]), final)
        if (header.job, header.rank, header.step) != (store.job, rank, step):
            final.unlink(missing_ok=True)
            raise ReplicationError(f"header names {header}, the request {store.job} rank {rank} step {step}")
        # Only the newest complete replica per rank is worth memory.
        for entry in store.complete(replica_of=node).get(rank, [])[1:]:
            entry.path.unlink(missing_ok=True)
        _send_line(self.connection, {"ok": True, "step": step, "rank": rank})

    def _get(self, request: dict[str, Any]) -> None:
        store = self._store(request)
        tier = request.get("tier", "replica")
        node = memckpt.safe_name(str(request.get("node", "")), "node")
        replica_of = node if tier == "replica" else None
        path = store.find(int(request["rank"]), int(request["step"]), replica_of=replica_of)
        if path is None:
            _send_line(self.connection, {"ok": False, "error": "no such snapshot"})
            return
        with open(path, "rb") as f:  # one open file: a concurrent prune cannot cut it short
            size = os.fstat(f.fileno()).st_size
            _send_line(self.connection, {"ok": True, "size": size})
            self.connection.sendfile(f)


class ReplicaServer(socketserver.ThreadingTCPServer):
    """A node agent's replication endpoint: receives its ring predecessor's snapshots, serves
    copies back for a restore. `port=0` picks a free one (see `address`)."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, root: str | os.PathLike[str] | None = None, host: str = "127.0.0.1", port: int = 0) -> None:
        self.root = memckpt.root_dir(root)
        super().__init__((host, port), _Handler)
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> tuple[str, int]:
        host, port = self.server_address[:2]
        return str(host), int(port)

    def start(self) -> ReplicaServer:
        self._thread = threading.Thread(target=self.serve_forever, name="memckpt-server", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self.shutdown()
        self.server_close()


# --- client -----------------------------------------------------------------------------------------


def send_snapshot(address: tuple[str, int], path: Path, *, job: str, node: str) -> memckpt.Header:
    """Replicate one complete local snapshot to the peer at `address`; returns its header once the
    peer stored it complete. Verifies the local copy first: a corrupt one is never replicated."""
    header = memckpt.verify(path)
    with socket.create_connection(address, timeout=TIMEOUT_S) as sock:
        size = memckpt.HEADER_SIZE + header.size
        _send_line(sock, {"op": "put", "job": job, "node": node, "name": path.name, "size": size})
        with open(path, "rb") as f:
            sock.sendfile(f, 0, size)
        reply = _read_line(sock.makefile("rb"))
    if not reply.get("ok"):
        raise ReplicationError(f"peer refused {path.name}: {reply.get('error')}")
    return header


def fetch_snapshot(
    address: tuple[str, int], dest: Path, *, job: str, node: str, rank: int, step: int, tier: str = "replica"
) -> memckpt.Header:
    """Fetch `node`'s snapshot of (rank, step) from the agent at `address` into `dest` (via a
    partial, header last) and verify it; raises `SnapshotError` or `ReplicationError`."""
    with socket.create_connection(address, timeout=TIMEOUT_S) as sock:
        _send_line(sock, {"op": "get", "job": job, "node": node, "rank": rank, "step": step, "tier": tier})
        stream = sock.makefile("rb")
        reply = _read_line(stream)
        if not reply.get("ok"):
            raise ReplicationError(f"peer has no {tier} of rank {rank} step {step}: {reply.get('error')}")
        header = _receive_file(stream, int(reply["size"]), dest)
    if (header.job, header.rank, header.step) != (job, rank, step):
        dest.unlink(missing_ok=True)
        raise memckpt.SnapshotError(f"fetched snapshot names {header}, wanted {job} rank {rank} step {step}")
    return header
