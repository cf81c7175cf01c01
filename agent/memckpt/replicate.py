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

Every request and every answer to it is proven with the attempt's replication key, and so is the
payload (agent/memckpt/auth.py); the framing and the receiving of a file are agent/memckpt/wire.py.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import socketserver
import threading
from pathlib import Path
from typing import Any

from aerie_contracts import memckpt
from agent.memckpt.auth import ANSWER, REQUEST, payload_mac, prove, proven, verify_and_mac
from agent.memckpt.store import SnapshotStore
from agent.memckpt.wire import ReplicationError, Unauthenticated, read_line, receive_file, send_line

log = logging.getLogger("aerie.agent.memckpt")

TIMEOUT_S = 30.0

REFUSED = "refused: no valid proof of this attempt's replication key"


parse_key, new_key = memckpt.parse_key, memckpt.new_key


def peer_of(nodes: list[str], node: str) -> str | None:
    """Where `node` sends its snapshots: the next node in the attempt's ring (None alone)."""
    if node not in nodes:
        raise ValueError(f"node {node!r} is not one of the attempt's nodes {nodes}")
    return None if len(nodes) < 2 else nodes[(nodes.index(node) + 1) % len(nodes)]


# --- server -----------------------------------------------------------------------------------------


class _Handler(socketserver.StreamRequestHandler):
    server: ReplicaServer

    def handle(self) -> None:
        self.connection.settimeout(TIMEOUT_S)
        self._key: bytes | None = None
        self._nonce = ""
        try:
            challenge = secrets.token_hex(16)
            send_line(self.connection, {"challenge": challenge})
            request = read_line(self.rfile)
            self._key = self.server.key_for(challenge, request)
            if self._key is None:
                log.warning(
                    "refused a replication request (op %r, job %r, node %r) from %s:%s: no valid proof of this "
                    "attempt's key",
                    str(request.get("op"))[:20],
                    str(request.get("job"))[:200],
                    str(request.get("node"))[:200],
                    *self.client_address[:2],
                )
                self.server.refused += 1
                send_line(self.connection, {"ok": False, "error": REFUSED})
                return
            self._nonce = str(request.get("nonce", ""))
            op = request.get("op")
            if op == "put":
                self._put(request)
            elif op == "get":
                self._get(request)
            else:
                self._answer({"ok": False, "error": f"unknown op {op!r}"})
        except Exception as exc:  # a bad request or a broken transfer: tell the peer if it listens
            log.warning("replication request from %s:%s failed: %s", *self.client_address[:2], exc)
            try:
                self._answer({"ok": False, "error": f"{type(exc).__name__}: {exc}"[:500]})
            except OSError:
                pass

    def _answer(self, obj: dict[str, Any]) -> None:
        """An answer line, proven with the key the request proved (none to an unproven request)."""
        if self._key is not None:
            obj = {**obj, "proof": prove(self._key, ANSWER, self._nonce, obj)}
        send_line(self.connection, obj)

    def _key_of(self) -> bytes:
        assert self._key is not None  # only proven requests get this far
        return self._key

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
        header = receive_file(
            self.rfile,
            int(request["size"]),
            final,
            crc32=int(request["crc32"]),
            key=self._key_of(),
            mac=request.get("mac"),
        )
        if (header.job, header.rank, header.step) != (store.job, rank, step):
            final.unlink(missing_ok=True)
            raise ReplicationError(f"header names {header}, the request {store.job} rank {rank} step {step}")
        # Older replicas go, but never the job's newest good step (memckpt.kept_steps).
        store.retain(good=self.server.good_step, floor=None, replica_of=node, rank=rank)
        self._answer({"ok": True, "step": step, "rank": rank})

    def _get(self, request: dict[str, Any]) -> None:
        store = self._store(request)
        tier = request.get("tier", "replica")
        node = memckpt.safe_name(str(request.get("node", "")), "node")
        replica_of = node if tier == "replica" else None
        path = store.find(int(request["rank"]), int(request["step"]), replica_of=replica_of)
        if path is None:
            self._answer({"ok": False, "error": "no such snapshot"})
            return
        with open(path, "rb") as f:  # one open file: a concurrent prune cannot cut it short
            size = os.fstat(f.fileno()).st_size
            try:
                crc = memckpt.Header.decode(f.read(memckpt.HEADER_SIZE)).crc32
            except memckpt.SnapshotError as exc:
                self._answer({"ok": False, "error": f"{type(exc).__name__}: {exc}"})
                return
            f.seek(0)
            mac = payload_mac(self._key_of())
            for chunk in iter(lambda: f.read(memckpt.CHUNK), b""):
                mac.update(chunk)
            f.seek(0)
            # The proof covers the size, the header's CRC-32 and the payload MAC, which the fetcher checks.
            self._answer({"ok": True, "size": size, "crc32": crc, "mac": mac.hexdigest()})
            self.connection.sendfile(f, 0, size)


class ReplicaServer(socketserver.ThreadingTCPServer):
    """A node agent's replication endpoint: receives its ring predecessor's snapshots, serves
    copies back for a restore. `port=0` picks a free one (see `address`)."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(
        self, root: str | os.PathLike[str] | None = None, host: str = "127.0.0.1", port: int = 0, *, key: bytes
    ) -> None:
        self.root = memckpt.root_dir(root)
        self.key = key
        self.refused = 0  # requests refused for want of a proof (tests, logs)
        self.good_step: int | None = None  # the job's newest good memory step (set by the node's tier)
        super().__init__((host, port), _Handler)
        self._thread: threading.Thread | None = None

    def set_key(self, key: bytes) -> None:
        """Serve another attempt (an in-place switch): the last one's key is no longer accepted."""
        self.key = key

    def key_for(self, challenge: str, request: dict[str, Any]) -> bytes | None:
        """The key `request` proved it holds for this connection's `challenge`, else None."""
        key = self.key
        return key if proven(key, REQUEST, challenge, request) else None

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


def _request(sock: socket.socket, stream, key: bytes, request: dict[str, Any]) -> str:
    """Answer the server's challenge: send `request` proven with `key`; returns the nonce its
    answers are proven with."""
    greeting = read_line(stream)
    challenge = greeting.get("challenge")
    if not isinstance(challenge, str):
        raise ReplicationError("the peer sent no challenge (not a replication endpoint of this version)")
    request = {**request, "nonce": secrets.token_hex(16)}
    send_line(sock, {**request, "proof": prove(key, REQUEST, challenge, request)})
    return str(request["nonce"])


def _answer_of(stream, key: bytes, nonce: str, what: str) -> dict[str, Any]:
    """The server's answer line; a success must be proven with the attempt's key."""
    reply = read_line(stream)
    if not reply.get("ok"):
        raise ReplicationError(f"{what} from the peer: {reply.get('error')}")
    if not proven(key, ANSWER, nonce, reply):
        raise Unauthenticated(f"the peer's answer to {what} is not proven with this attempt's key")
    return reply


def send_snapshot(address: tuple[str, int], path: Path, *, job: str, node: str, key: bytes) -> memckpt.Header:
    """Replicate one complete local snapshot to the peer at `address`; returns its header once the
    peer stored it complete. Verifies the local copy first: a corrupt one is never replicated."""
    header, mac = verify_and_mac(path, key)
    with socket.create_connection(address, timeout=TIMEOUT_S) as sock:
        stream = sock.makefile("rb")
        size = memckpt.HEADER_SIZE + header.size
        request = {
            "op": "put",
            "job": job,
            "node": node,
            "name": path.name,
            "size": size,
            "crc32": header.crc32,
            "mac": mac,
        }
        nonce = _request(sock, stream, key, request)
        try:
            with open(path, "rb") as f:
                sock.sendfile(f, 0, size)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the peer stopped reading (a refusal): its answer says why, if it still can
        _answer_of(stream, key, nonce, path.name)
    return header


def fetch_snapshot(
    address: tuple[str, int],
    dest: Path,
    *,
    job: str,
    node: str,
    rank: int,
    step: int,
    key: bytes,
    tier: str = "replica",
) -> memckpt.Header:
    """Fetch `node`'s snapshot of (rank, step) from the agent at `address` into `dest` (via a
    partial, header last) and verify it; raises `SnapshotError` or `ReplicationError`."""
    with socket.create_connection(address, timeout=TIMEOUT_S) as sock:
        stream = sock.makefile("rb")
        request = {"op": "get", "job": job, "node": node, "rank": rank, "step": step, "tier": tier}
        nonce = _request(sock, stream, key, request)
        reply = _answer_of(stream, key, nonce, f"{tier} of rank {rank} step {step}")
        header = receive_file(
            stream, int(reply["size"]), dest, crc32=int(reply["crc32"]), key=key, mac=reply.get("mac")
        )
    if (header.job, header.rank, header.step) != (job, rank, step):
        dest.unlink(missing_ok=True)
        raise memckpt.SnapshotError(f"fetched snapshot names {header}, wanted {job} rank {rank} step {step}")
    return header
