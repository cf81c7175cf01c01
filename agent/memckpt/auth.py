"""The replication key's proofs: what makes a replication request, answer or payload this attempt's.

Authentication (scoped to the attempt): each connection opens with the server's line
`{"challenge"}` (16 random bytes, hex); the client's request carries `nonce` (its own 16 random
bytes) and `proof` = HMAC-SHA256(key, "request" + challenge + the request's canonical JSON
without `proof`); every answer the server sends after a valid request carries `proof` =
HMAC-SHA256(key, "answer" + nonce + the answer's canonical JSON). The key is the attempt's
replication secret (`AERIE_MEMORY_CHECKPOINT_KEY`, from the control plane, new each attempt). A
request without the right proof is refused (`{"ok": false, "error": "refused: ..."}`) and logged
with its peer's address, never with the key or the proof; a client refuses an answer without the
right proof. A `put` request names the snapshot header's `crc32` and the receiver checks the
header it receives against it, so the proof covers the stream's header.

The payload is authenticated too, not only checksummed: a `put` request (and a `get`'s answer)
carries `mac` = HMAC-SHA256(key, "aerie-memckpt/payload" + every byte of the snapshot file, header
block included), computed by the sender in the same pass that verifies its CRC-32 and, being part
of the proven line, bound to this connection. The receiver computes it over the bytes as they
arrive and keeps the partial (never renames it into a replica or a restored copy) unless it
matches: a man in the middle who rewrites the payload and fixes up its CRC-32 (CRC is linear:
that is easy) is refused (`TamperedSnapshot`).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import zlib
from pathlib import Path
from typing import Any

from aerie_contracts import memckpt


def _canonical(obj: dict[str, Any]) -> bytes:
    return json.dumps({k: v for k, v in obj.items() if k != "proof"}, sort_keys=True, separators=(",", ":")).encode()


def prove(key: bytes, label: bytes, nonce: str, obj: dict[str, Any]) -> str:
    return hmac.new(key, label + b"\n" + nonce.encode() + b"\n" + _canonical(obj), hashlib.sha256).hexdigest()


def proven(key: bytes, label: bytes, nonce: str, obj: dict[str, Any]) -> bool:
    proof = obj.get("proof")
    return isinstance(proof, str) and hmac.compare_digest(proof, prove(key, label, nonce, obj))


# What each MAC is of, so that no proof of one kind passes for another.
REQUEST, ANSWER, _PAYLOAD = b"aerie-memckpt/request", b"aerie-memckpt/answer", b"aerie-memckpt/payload\n"


def payload_mac(key: bytes) -> hmac.HMAC:
    return hmac.new(key, _PAYLOAD, hashlib.sha256)


def verify_and_mac(path: Path, key: bytes) -> tuple[memckpt.Header, str]:
    """One pass over a complete local snapshot: its header once its payload matches the CRC-32
    (else raises, as `memckpt.verify`), and the payload MAC of the whole file under `key`."""
    header = memckpt.read_header(path)
    mac, crc = payload_mac(key), 0
    with open(path, "rb") as f:
        mac.update(f.read(memckpt.HEADER_SIZE))
        left = header.size
        while left > 0:
            chunk = f.read(min(memckpt.CHUNK, left))
            if not chunk:
                raise memckpt.TornSnapshot(f"{path}: {header.size - left} payload bytes of {header.size}")
            crc = zlib.crc32(chunk, crc)
            mac.update(chunk)
            left -= len(chunk)
    if crc != header.crc32:
        raise memckpt.CorruptSnapshot(f"{path}: payload CRC-32 {crc:08x}, header says {header.crc32:08x}")
    return header, mac.hexdigest()
