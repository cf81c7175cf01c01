"""Which checkpoints are good: the manifest, written last, is the commit point.

Layout (`aerie_contracts.checkpoints`): `<prefix>/step_00000500/attempt_0002/` holds the DCP
shard files and `.metadata` of step 500 as saved by attempt 2 of the job (its epoch); a save
made outside Aerie has no attempt directory (`<prefix>/step_00000500/`). After every rank
finished, rank 0 calls `commit()`, which lists what is there and writes `manifest.json` last.
A checkpoint is *good* when its manifest is present, every object it lists is present with
its size (and checksum, on a deep verify), and it carries no `BAD` marker. Everything else (a
save that died half-way, an object lost later) is not good, and `last_good()` skips it.

Fencing: S3 alone cannot tell a checkpoint committed by a live attempt from one a zombie of a
superseded attempt committed after the job moved on. The control plane can: it records a
checkpoint only while its attempt is the job's current one. Readers that have its record pass
it as `recorded` ({uri: state}); then a checkpoint is good only if the record says so too, and
one the record does not know counts as incomplete (`list_checkpoints`, `last_good`, `gc`).

Torch-free and small on purpose: AWS Lambda handlers (`chain_restart`, `checkpoint_gc`)
import it to find the resume point. Works on `s3://bucket/prefix` and on local paths or
`file://` URIs through `storage` (which also says what checksum is recorded per object).
Deleting old checkpoints and aborting dead multipart uploads is `gc`'s.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from aerie_checkpoint.storage import ObjectStat, join_uri, open_store
from aerie_contracts import checkpoints as layout
from aerie_contracts.states import CheckpointState

MANIFEST = layout.MANIFEST
BAD_MARKER = layout.BAD_MARKER
FORMAT = layout.FORMAT
STEP_RE = layout.STEP_RE
ATTEMPT_RE = layout.ATTEMPT_RE

step_dir = layout.step_dir


def checkpoint_uri(prefix: str, step: int, attempt: int | None = None) -> str:
    """Where attempt `attempt` saves step `step` under `prefix` (no attempt: outside Aerie)."""
    uri = f"{str(prefix).rstrip('/')}/{step_dir(step)}"
    return uri if attempt is None else f"{uri}/{layout.attempt_dir(attempt)}"


@dataclass(frozen=True)
class CheckpointRef:
    prefix: str
    step: int
    attempt: int | None = None

    @property
    def key(self) -> tuple[int, int]:
        """Order of checkpoints: by step, then by the attempt that saved it (none first)."""
        return (self.step, -1 if self.attempt is None else self.attempt)


def parse_uri(uri: str | os.PathLike[str]) -> CheckpointRef | None:
    """(prefix, step, attempt) of a checkpoint URI, or None if it does not name one."""
    text = str(uri).rstrip("/")
    head, _, name = text.rpartition("/")
    if (m := ATTEMPT_RE.match(name)) is not None:
        prefix, _, step_name = head.rpartition("/")
        if (s := STEP_RE.match(step_name)) is not None:
            return CheckpointRef(prefix, int(s.group(1)), int(m.group(1)))
        return None
    if (s := STEP_RE.match(name)) is not None:
        return CheckpointRef(head, int(s.group(1)), None)
    return None


# --- commit -----------------------------------------------------------------------------


def commit(
    checkpoint_uri: str | os.PathLike[str],
    *,
    step: int,
    tokens: int = 0,
    world: dict[str, Any] | None = None,
    config_hash: str = "",
    code_version: str = "",
    metrics: dict[str, Any] | None = None,
    extra: dict[str, Any] | None = None,
    attempt: int | None = None,
    attempt_id: str = "",
) -> dict[str, Any]:
    """Record every object of a finished checkpoint, then write `manifest.json` last.

    Call once, on rank 0, after all ranks finished writing (a barrier). `attempt` / `attempt_id`
    name the writer (its epoch). Returns the manifest.
    """
    store = open_store(checkpoint_uri)
    objects = []
    for rel, stat in sorted(store.list().items()):
        if rel in (MANIFEST, BAD_MARKER) or rel.endswith(".tmp"):
            continue
        objects.append({"key": rel, "size": stat.size, **store.checksum(rel, stat)})
    if not objects:
        raise FileNotFoundError(f"nothing to commit under {checkpoint_uri}")
    manifest: dict[str, Any] = {
        "format": FORMAT,
        "step": int(step),
        "tokens": int(tokens),
        "world": world or {},
        "config_hash": config_hash,
        "code_version": code_version,
        "metrics": metrics or {},
        "committed_at": time.time(),
        "total_bytes": sum(o["size"] for o in objects),
        "objects": objects,
        **({"extra": extra} if extra else {}),
        **({layout.MANIFEST_ATTEMPT: int(attempt)} if attempt is not None else {}),
        **({layout.MANIFEST_ATTEMPT_ID: attempt_id} if attempt_id else {}),
    }
    store.write(MANIFEST, json.dumps(manifest, indent=1, sort_keys=True).encode())
    return manifest


def read_manifest(checkpoint_uri: str | os.PathLike[str]) -> dict[str, Any] | None:
    data = open_store(checkpoint_uri).read(MANIFEST)
    if data is None:
        return None
    try:
        return cast("dict[str, Any] | None", json.loads(data))
    except ValueError:
        return None


# --- verify -----------------------------------------------------------------------------


@dataclass
class Verification:
    good: bool
    reasons: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return self.good


def _check(manifest: dict[str, Any] | None, listing: dict[str, ObjectStat], bad: bytes | None) -> list[str]:
    """The shallow checks, against one listing of the checkpoint."""
    if bad is not None:
        reason = _bad_reason(bad)
        return [f"marked bad: {reason}" if reason else "marked bad"]
    if manifest is None:
        return ["no manifest (incomplete or unreadable)"]
    reasons = []
    for obj in manifest.get("objects", []):
        stat = listing.get(obj["key"])
        if stat is None:
            reasons.append(f"{obj['key']}: missing")
        elif stat.size != obj["size"]:
            reasons.append(f"{obj['key']}: size {stat.size} != {obj['size']}")
    if not manifest.get("objects"):
        reasons.append("manifest lists no objects")
    return reasons


def _bad_reason(data: bytes) -> str:
    try:
        return cast(str, json.loads(data).get("reason", ""))
    except ValueError:
        return data.decode(errors="replace")


def verify(checkpoint_uri: str | os.PathLike[str], deep: bool = False) -> Verification:
    """Is this checkpoint good? `deep` also re-reads every object and compares checksums."""
    store = open_store(checkpoint_uri)
    listing = store.list()
    manifest = read_manifest(checkpoint_uri) if MANIFEST in listing else None
    bad = store.read(BAD_MARKER) if BAD_MARKER in listing else None
    reasons = _check(manifest, listing, bad)
    if deep and not reasons:
        assert manifest is not None  # no reasons: `_check` found a manifest
        for obj in manifest["objects"]:
            if reason := store.deep_check(obj["key"], obj):
                reasons.append(reason)
    return Verification(not reasons, reasons)


# --- listing ----------------------------------------------------------------------------


@dataclass
class CheckpointInfo:
    uri: str
    step: int
    state: str  # a CheckpointState: good | bad | incomplete (no manifest, or unrecorded) | corrupt | deleted
    reasons: list[str] = field(default_factory=list)
    manifest: dict[str, Any] | None = None
    bytes: int = 0  # what is stored now
    attempt: int | None = None  # the epoch of the attempt that saved it (None: saved outside Aerie)
    keys: list[str] = field(default_factory=list)  # its objects, relative to the prefix

    @property
    def good(self) -> bool:
        return self.state == CheckpointState.GOOD

    @property
    def ref(self) -> CheckpointRef:
        return CheckpointRef(self.uri.rsplit("/", 2 if self.attempt is not None else 1)[0], self.step, self.attempt)


Recorded = Mapping[str, str]  # the control plane's record: checkpoint URI -> CheckpointState


def _group(listing: dict[str, ObjectStat]) -> dict[tuple[int, int | None], tuple[str, dict[str, ObjectStat]]]:
    """Objects of a prefix by checkpoint: (step, attempt) -> (directory, {key in it: stat})."""
    groups: dict[tuple[int, int | None], tuple[str, dict[str, ObjectStat]]] = {}
    for rel, stat in listing.items():
        parts = rel.split("/")
        step = STEP_RE.match(parts[0]) if len(parts) >= 2 else None
        if step is None:
            continue
        attempt = ATTEMPT_RE.match(parts[1]) if len(parts) >= 3 else None
        key: tuple[int, int | None]
        if attempt is not None:
            key, base, rest = (int(step.group(1)), int(attempt.group(1))), "/".join(parts[:2]), "/".join(parts[2:])
        else:
            key, base, rest = (int(step.group(1)), None), parts[0], "/".join(parts[1:])
        groups.setdefault(key, (base, {}))[1][rest] = stat
    return groups


def _apply_record(state: str, reasons: list[str], uri: str, recorded: Recorded | None) -> tuple[str, list[str]]:
    """A checkpoint good in S3 is good only if the control plane recorded it as good."""
    if recorded is None or state != CheckpointState.GOOD:
        return state, reasons
    rec = recorded.get(uri.rstrip("/"))
    if rec == CheckpointState.GOOD:
        return state, reasons
    if rec is None:
        return CheckpointState.INCOMPLETE, [
            "not recorded by the control plane (committed by a superseded attempt, or never reported)"
        ]
    known = {s.value for s in CheckpointState}
    return (rec if rec in known else CheckpointState.INCOMPLETE), [f"{rec} in the control plane's record"]


def list_checkpoints(prefix: str | os.PathLike[str], recorded: Recorded | None = None) -> list[CheckpointInfo]:
    """Every checkpoint under `prefix`, oldest first (by step, then attempt), with its (shallow)
    state. `recorded`: the control plane's record, which a good checkpoint must be in (fencing).

    One listing of the prefix plus one GET per manifest.
    """
    store = open_store(prefix)
    out = []
    groups = _group(store.list())
    for step, attempt in sorted(groups, key=lambda k: (k[0], -1 if k[1] is None else k[1])):
        base, listing = groups[(step, attempt)]
        uri = join_uri(prefix, base)
        manifest = read_manifest(uri) if MANIFEST in listing else None
        bad = store.read(f"{base}/{BAD_MARKER}") if BAD_MARKER in listing else None
        reasons = _check(manifest, listing, bad)
        if bad is not None:
            state: str = CheckpointState.BAD
        elif manifest is None:
            state = CheckpointState.INCOMPLETE
        else:
            state = CheckpointState.CORRUPT if reasons else CheckpointState.GOOD
        state, reasons = _apply_record(state, reasons, uri, recorded)
        size = sum(s.size for s in listing.values())
        keys = [f"{base}/{rel}" for rel in sorted(listing)]
        out.append(CheckpointInfo(uri, step, str(state), reasons, manifest, size, attempt, keys))
    return out


def last_good(prefix: str | os.PathLike[str], deep: bool = False, recorded: Recorded | None = None) -> str | None:
    """URI of the newest good checkpoint under `prefix` (None if there is none). With `recorded`,
    only one the control plane recorded as good (a superseded attempt's commit never is)."""
    for info in reversed(list_checkpoints(prefix, recorded)):
        if info.good and (not deep or verify(info.uri, deep=True).good):
            return info.uri
    return None


def mark_bad(checkpoint_uri: str | os.PathLike[str], reason: str) -> None:
    """Flag a checkpoint as not to be resumed from. Writes a `BAD` object; deletes nothing."""
    body = json.dumps({"reason": reason, "marked_at": time.time()}).encode()
    open_store(checkpoint_uri).write(BAD_MARKER, body)
