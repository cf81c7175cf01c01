"""The replication wire, below the protocol: JSON lines, exact reads, and a snapshot file received
into place (via a partial, header last: a transfer cut short never leaves a replica).
"""

from __future__ import annotations

import hmac
import json
import os
import socket
import zlib
from pathlib import Path
from typing import Any

from aerie_contracts import memckpt
from agent.memckpt.auth import payload_mac

MAX_LINE = 64 * 1024


class ReplicationError(Exception):
    """The peer refused the transfer, or the connection failed."""


class Unauthenticated(ReplicationError):
    """A request or an answer without the attempt's proof."""


class TamperedSnapshot(Unauthenticated):
    """The streamed bytes do not carry the sender's payload MAC (whatever their CRC-32 says)."""


def send_line(sock: socket.socket, obj: dict[str, Any]) -> None:
    sock.sendall(json.dumps(obj).encode() + b"\n")


def read_line(stream) -> dict[str, Any]:
    line = stream.readline(MAX_LINE + 1)
    if not line.endswith(b"\n"):
        raise ReplicationError("connection closed or line too long")
    value = json.loads(line)
    if not isinstance(value, dict):
        raise ReplicationError("a JSON object was expected")
    return value


def read_exact(stream, n: int) -> bytes:
    data = stream.read(n)
    if len(data) != n:
        raise ReplicationError(f"connection closed after {len(data)} of {n} bytes")
    return data


def receive_file(stream, size: int, final: Path, *, crc32: int, key: bytes, mac: object) -> memckpt.Header:
    """`size` bytes of a snapshot file into `final` (via a partial; header last), CRC checked,
    the header's CRC-32 the `crc32` that the peer's proven line named and the bytes' payload MAC
    under `key` the `mac` it named."""
    if size < memckpt.HEADER_SIZE:
        raise ReplicationError(f"a snapshot of {size} bytes has no header")
    if not isinstance(mac, str):
        raise TamperedSnapshot("the peer named no payload MAC")
    block = read_exact(stream, memckpt.HEADER_SIZE)
    header = memckpt.Header.decode(block)
    running = payload_mac(key)
    running.update(block)
    if header.crc32 != crc32:
        raise ReplicationError(f"the header's CRC-32 {header.crc32:08x} is not the proven {crc32:08x}")
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
                running.update(chunk)
                f.write(chunk)
                left -= len(chunk)
            if crc != header.crc32:
                raise memckpt.CorruptSnapshot(f"received payload CRC-32 {crc:08x}, header says {header.crc32:08x}")
            if not hmac.compare_digest(running.hexdigest(), mac):
                raise TamperedSnapshot("the received bytes do not carry the sender's payload MAC")
            f.flush()
            memckpt.write_header(f.fileno(), header)
        os.replace(partial, final)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    return header
