"""The in-memory checkpoint tier's snapshot file: what a rank hands its node agent, in shared memory.

One snapshot is one file in the node's shared-memory area (`/dev/shm/...`, never a disk):

    [header block, HEADER_SIZE bytes][payload, `size` bytes]

The writer reserves the header block as zeros, writes the payload, and writes the header *last*
(one `pwrite` of one block). The header names the snapshot (job, attempt, step, rank), the payload's
size and its CRC-32, and carries a CRC-32 of its own, so a reader tells apart:

- a torn snapshot (the writer died before the header: zeros, or a header that fails its own CRC,
  or a file shorter than the header says) -> `TornSnapshot`;
- a corrupt one (complete header, payload whose CRC differs: a flipped byte) -> `CorruptSnapshot`.

Neither is ever restored from. The payload's format belongs to the trainer (a `torch.save` stream);
the agent only stores, replicates and verifies bytes, so this module is standard library only.

Layout of the area (`area_dir(root, job)`): `local/` holds this node's ranks' snapshots,
`replica/<node>/` the copies a peer node replicated here.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import struct
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path

HEADER_SIZE = 4096
MAGIC = b"AERIEMEM"
FORMAT = 1
DEFAULT_ROOT = "/dev/shm/aerie-memckpt"
LOCAL, REPLICA = "local", "replica"
SUFFIX = ".snap"
PARTIAL = ".partial"  # a snapshot being written or received; never read as one
# MAGIC, format, length of the JSON that follows, CRC-32 of that JSON.
_PREFIX = struct.Struct("<8sIII")
_NAME_RE = re.compile(r"^rank_(\d{5,})\.step_(\d{8,})\.snap$")
_SAFE = re.compile(r"^[A-Za-z0-9._-]{1,200}$")
CHUNK = 1 << 20  # bytes per read when checksumming or streaming


# The attempt's replication key (agent/memckpt/replicate.py): where a backend's handle keeps it for
# the control plane, which hands an in-place successor's to each agent (GET .../next).
HANDLE_KEY = "memckpt_key"
KEY_BYTES = 32


def new_key() -> str:
    """A fresh replication key, hex: one per attempt, the same on each of its nodes."""
    return secrets.token_hex(KEY_BYTES)


def parse_key(value: str) -> bytes:
    """A replication key (hex, at least 16 bytes) -> its bytes; ValueError otherwise (whose message
    never repeats the value: it is a secret)."""
    try:
        key = bytes.fromhex(value.strip())
    except ValueError:
        raise ValueError("the replication key is not hex") from None
    if len(key) < 16:
        raise ValueError(f"the replication key holds {len(key)} bytes, at least 16 are needed")
    return key


class SnapshotError(Exception):
    """A snapshot that must not be restored from."""


class TornSnapshot(SnapshotError):
    """Header missing, incomplete or shorter payload: the writer (or a transfer) did not finish."""


class CorruptSnapshot(SnapshotError):
    """Complete header but the payload's checksum differs."""


@dataclass(frozen=True)
class Header:
    job: str
    attempt: int
    step: int
    rank: int
    size: int
    crc32: int

    def encode(self) -> bytes:
        body = json.dumps(asdict(self), sort_keys=True).encode()
        block = _PREFIX.pack(MAGIC, FORMAT, len(body), zlib.crc32(body)) + body
        if len(block) > HEADER_SIZE:
            raise ValueError(f"snapshot header too long ({len(block)} bytes)")
        return block.ljust(HEADER_SIZE, b"\0")

    @classmethod
    def decode(cls, block: bytes) -> Header:
        if len(block) < _PREFIX.size:
            raise TornSnapshot("no header")
        magic, fmt, length, crc = _PREFIX.unpack_from(block)
        if magic != MAGIC:
            raise TornSnapshot("no header (the writer did not finish)")
        if fmt != FORMAT:
            raise SnapshotError(f"snapshot format {fmt}, this code reads {FORMAT}")
        body = block[_PREFIX.size : _PREFIX.size + length]
        if len(body) != length or zlib.crc32(body) != crc:
            raise TornSnapshot("header incomplete (its checksum differs)")
        fields = json.loads(body)
        try:
            return cls(
                job=str(fields["job"]),
                attempt=int(fields["attempt"]),
                step=int(fields["step"]),
                rank=int(fields["rank"]),
                size=int(fields["size"]),
                crc32=int(fields["crc32"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise TornSnapshot(f"header fields missing: {exc}") from None


def safe_name(value: str, what: str) -> str:
    """A job id or node name used as a directory name: no separators, nothing odd."""
    if not _SAFE.match(value) or value in (".", ".."):
        raise ValueError(f"{what} {value!r}: letters, digits, '.', '_', '-' only (1-200)")
    return value


def root_dir(root: str | os.PathLike[str] | None = None) -> Path:
    from aerie_contracts import env

    return Path(root or os.environ.get(env.MEMORY_CHECKPOINT_DIR) or DEFAULT_ROOT)


def area_dir(root: str | os.PathLike[str] | None, job: str) -> Path:
    return root_dir(root) / safe_name(job, "job")


def local_dir(root: str | os.PathLike[str] | None, job: str) -> Path:
    return area_dir(root, job) / LOCAL


def replica_dir(root: str | os.PathLike[str] | None, job: str, node: str) -> Path:
    return area_dir(root, job) / REPLICA / safe_name(node, "node")


def file_name(step: int, rank: int) -> str:
    return f"rank_{int(rank):05d}.step_{int(step):08d}{SUFFIX}"


def parse_name(name: str) -> tuple[int, int] | None:
    """(rank, step) of a snapshot file name; None for anything else (partials included)."""
    match = _NAME_RE.match(name)
    return (int(match.group(1)), int(match.group(2))) if match else None


def read_header(path: str | os.PathLike[str]) -> Header:
    """The header of a snapshot file, checked for completeness (not the payload: see `verify`)."""
    try:
        with open(path, "rb") as f:
            block = f.read(HEADER_SIZE)
            size = os.fstat(f.fileno()).st_size
    except FileNotFoundError:
        raise TornSnapshot(f"{path}: no such snapshot") from None
    header = Header.decode(block)
    if size < HEADER_SIZE + header.size:
        raise TornSnapshot(f"{path}: {size - HEADER_SIZE} payload bytes of {header.size}")
    return header


def crc32_of(path: str | os.PathLike[str], offset: int, size: int) -> int:
    crc = 0
    with open(path, "rb") as f:
        f.seek(offset)
        left = size
        while left > 0:
            chunk = f.read(min(CHUNK, left))
            if not chunk:
                break
            crc = zlib.crc32(chunk, crc)
            left -= len(chunk)
    return crc


def verify(path: str | os.PathLike[str]) -> Header:
    """The header of a complete snapshot whose payload matches its checksum, else raises."""
    header = read_header(path)
    actual = crc32_of(path, HEADER_SIZE, header.size)
    if actual != header.crc32:
        raise CorruptSnapshot(f"{path}: payload CRC-32 {actual:08x}, header says {header.crc32:08x}")
    return header


def write_header(fd: int, header: Header) -> None:
    """Write the header block at offset 0: the last write of a snapshot, which makes it complete."""
    os.pwrite(fd, header.encode(), 0)


# --- retention: which snapshots a node keeps ---------------------------------------------------------
# A memory checkpoint is good once every node's two copies are complete; the control plane records
# it and each heartbeat's answer names the job's newest good one (`HEARTBEAT_GOOD_STEP`, a field of
# orchestrator.api.schemas.HeartbeatOut). A node never deletes that step's snapshots (own or
# replica) while it is good: it prunes only below min(what it replicated or received, the good step).
#
# The bound on shared memory: per rank and per copy (this node's own snapshots, each peer's
# replicas) at most MAX_HELD complete snapshots, the good one always among them (the oldest others
# go first), plus the one file being written or received. A rank whose agent takes nothing (no
# tier) keeps at most MAX_HELD + 1 of its own. So one rank's state costs a node at most
# 2 x MAX_HELD (+1 in flight) snapshots' worth of /dev/shm, however long a peer stays behind; with
# the nodes keeping up, the good step is the newest replicated one and 1-2 per copy are held.
HEARTBEAT_GOOD_STEP = "memory_good_step"
MAX_HELD = 3
# In a node's `local/` folder: the step the agent protects ({"step": N}), so that a rank's own
# pruning (trainer/checkpoint/memory.py) never drops the good snapshot the agent must keep.
KEEP_FILE = "keep.json"


def kept_steps(steps: set[int] | list[int], *, good: int | None, floor: int | None, cap: int = MAX_HELD) -> set[int]:
    """Of one rank's held steps (one copy), those that stay: none below `floor` but `good`; then,
    beyond `cap`, the oldest go first, never `good`. `good` None (no good memory checkpoint known,
    or a control plane that does not say): only the cap applies."""
    held = sorted(set(steps), reverse=True)
    keep = [s for s in held if s == good or floor is None or s >= floor]
    if len(keep) <= cap:
        return set(keep)
    protected = {s for s in keep if s == good}
    newest = [s for s in keep if s not in protected][: max(cap - len(protected), 0)]
    return protected | set(newest)


def write_keep(folder: str | os.PathLike[str], step: int | None) -> None:
    """Record (atomically) the step the agent protects in `folder` (None: none)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / (KEEP_FILE + PARTIAL)
    tmp.write_text(json.dumps({"step": step}))
    os.replace(tmp, folder / KEEP_FILE)


def read_keep(folder: str | os.PathLike[str]) -> int | None:
    """The step the agent protects in `folder`, None if none (or unreadable)."""
    try:
        step = json.loads((Path(folder) / KEEP_FILE).read_text()).get("step")
    except (OSError, ValueError, AttributeError):
        return None
    return step if isinstance(step, int) and not isinstance(step, bool) else None
