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
import it to find the resume point. Works on `s3://bucket/prefix` (boto3 through
`s3io`) and on local paths or `file://` URIs.

Checksums: on S3 the manifest records each object's ETag from the listing (no data is
re-read at commit); deep verify re-reads the object and recomputes the ETag (MD5, or the
multipart MD5-of-part-MD5s). On files it records a streamed sha256.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
import urllib.parse
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from aerie_contracts import checkpoints as layout
from aerie_contracts import env
from aerie_contracts.states import CheckpointState
from trainer.checkpoint import s3io

MANIFEST = layout.MANIFEST
BAD_MARKER = layout.BAD_MARKER
FORMAT = layout.FORMAT
STEP_RE = layout.STEP_RE
ATTEMPT_RE = layout.ATTEMPT_RE
_CHUNK = 8 * 1024 * 1024

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


def parse_uri(uri: str | os.PathLike) -> CheckpointRef | None:
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


# --- storage: the few operations the manifest needs, for S3 and for files ------------


@dataclass(frozen=True)
class ObjectStat:
    size: int
    etag: str | None = None


class _S3Store:
    def __init__(self, uri: str):
        self.bucket, key = s3io.parse_uri(uri)
        self.root = key.rstrip("/")
        self.client = s3io.boto3_client()

    def _key(self, rel: str) -> str:
        return f"{self.root}/{rel}" if self.root else rel

    def list(self, rel: str = "") -> dict[str, ObjectStat]:
        """All objects under `rel` (recursively), keyed by path relative to the root."""
        prefix = self._key(rel).rstrip("/") + "/" if (self.root or rel) else ""
        out: dict[str, ObjectStat] = {}
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
            for obj in page.get("Contents", []):
                rel_key = obj["Key"][len(self.root) + 1 :] if self.root else obj["Key"]
                out[rel_key] = ObjectStat(obj["Size"], obj.get("ETag", "").strip('"') or None)
        return out

    def stat(self, rel: str) -> ObjectStat | None:
        try:
            head = self.client.head_object(Bucket=self.bucket, Key=self._key(rel))
        except self.client.exceptions.ClientError as e:
            if e.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return None
            raise
        return ObjectStat(head["ContentLength"], head.get("ETag", "").strip('"') or None)

    def read(self, rel: str) -> bytes | None:
        try:
            return self.client.get_object(Bucket=self.bucket, Key=self._key(rel))["Body"].read()
        except self.client.exceptions.NoSuchKey:
            return None

    def write(self, rel: str, data: bytes) -> None:
        self.client.put_object(Bucket=self.bucket, Key=self._key(rel), Body=data)

    def delete(self, rels: Iterable[str]) -> None:
        keys = [{"Key": self._key(r)} for r in rels]
        if not keys:
            return
        for i in range(0, len(keys), 1000):
            self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": keys[i : i + 1000], "Quiet": True})

    def checksum(self, rel: str, stat: ObjectStat) -> dict:
        return {"etag": stat.etag} if stat.etag else {}

    def deep_check(self, rel: str, entry: dict) -> str | None:
        """Re-read the object and recompute its ETag; a reason string when it differs."""
        etag = entry.get("etag")
        if not etag or not re.fullmatch(r"[0-9a-f]{32}(-\d+)?", etag):
            return None  # nothing recomputable recorded (e.g. an SSE-KMS ETag)
        key = self._key(rel)
        parts = int(etag.split("-")[1]) if "-" in etag else 0
        part_size = None
        if parts:
            part_size = self.client.head_object(Bucket=self.bucket, Key=key, PartNumber=1)["ContentLength"]
        body = self.client.get_object(Bucket=self.bucket, Key=key)["Body"]
        got = _etag_of(iter(lambda: body.read(_CHUNK), b""), part_size)
        return None if got == etag else f"{rel}: checksum mismatch (etag {got} != {etag})"


def _etag_of(chunks: Iterator[bytes], part_size: int | None) -> str:
    """S3's ETag of an unencrypted object: MD5, or MD5 of the parts' MD5s plus `-N`."""
    if not part_size:
        md5 = hashlib.md5()
        for c in chunks:
            md5.update(c)
        return md5.hexdigest()
    digests, md5, filled = [], hashlib.md5(), 0
    for c in chunks:
        view = memoryview(c)
        while view:
            take = min(len(view), part_size - filled)
            md5.update(view[:take])
            filled += take
            view = view[take:]
            if filled == part_size:
                digests.append(md5.digest())
                md5, filled = hashlib.md5(), 0
    if filled:
        digests.append(md5.digest())
    return f"{hashlib.md5(b''.join(digests)).hexdigest()}-{len(digests)}"


class _FileStore:
    def __init__(self, uri: str):
        text = str(uri)
        self.root = Path(urllib.parse.urlparse(text).path if text.startswith("file://") else text)

    def list(self, rel: str = "") -> dict[str, ObjectStat]:
        base = self.root / rel if rel else self.root
        out: dict[str, ObjectStat] = {}
        if not base.is_dir():
            return out
        for dirpath, _, files in os.walk(base):
            for name in files:
                path = Path(dirpath) / name
                try:
                    out[path.relative_to(self.root).as_posix()] = ObjectStat(path.stat().st_size)
                except FileNotFoundError:
                    pass
        return out

    def stat(self, rel: str) -> ObjectStat | None:
        try:
            return ObjectStat((self.root / rel).stat().st_size)
        except FileNotFoundError:
            return None

    def read(self, rel: str) -> bytes | None:
        try:
            return (self.root / rel).read_bytes()
        except FileNotFoundError:
            return None

    def write(self, rel: str, data: bytes) -> None:
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)  # atomic: a reader sees the whole manifest or none

    def delete(self, rels: Iterable[str]) -> None:
        dirs = set()
        for rel in rels:
            (self.root / rel).unlink(missing_ok=True)
            dirs.update((self.root / rel).parents)
        for d in sorted(dirs, key=lambda p: len(p.parts), reverse=True):
            if d != self.root and self.root in d.parents:
                try:
                    d.rmdir()
                except OSError:
                    pass

    def _sha256(self, rel: str) -> str:
        h = hashlib.sha256()
        with open(self.root / rel, "rb") as f:
            while chunk := f.read(_CHUNK):
                h.update(chunk)
        return h.hexdigest()

    def checksum(self, rel: str, stat: ObjectStat) -> dict:
        return {"sha256": self._sha256(rel)}

    def deep_check(self, rel: str, entry: dict) -> str | None:
        if "sha256" not in entry:
            return None
        got = self._sha256(rel)
        return None if got == entry["sha256"] else f"{rel}: checksum mismatch (sha256 {got} != {entry['sha256']})"


def _store(uri: str | os.PathLike):
    return _S3Store(str(uri)) if s3io.is_s3(uri) else _FileStore(str(uri))


def _join(prefix: str | os.PathLike, name: str) -> str:
    return f"{str(prefix).rstrip('/')}/{name}"


# --- commit -----------------------------------------------------------------------------


def commit(
    checkpoint_uri: str | os.PathLike,
    *,
    step: int,
    tokens: int = 0,
    world: dict | None = None,
    config_hash: str = "",
    code_version: str = "",
    metrics: dict | None = None,
    extra: dict | None = None,
    attempt: int | None = None,
    attempt_id: str = "",
) -> dict:
    """Record every object of a finished checkpoint, then write `manifest.json` last.

    Call once, on rank 0, after all ranks finished writing (a barrier). `attempt` / `attempt_id`
    name the writer (its epoch). Returns the manifest.
    """
    store = _store(checkpoint_uri)
    objects = []
    for rel, stat in sorted(store.list().items()):
        if rel in (MANIFEST, BAD_MARKER) or rel.endswith(".tmp"):
            continue
        objects.append({"key": rel, "size": stat.size, **store.checksum(rel, stat)})
    if not objects:
        raise FileNotFoundError(f"nothing to commit under {checkpoint_uri}")
    manifest = {
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


def read_manifest(checkpoint_uri: str | os.PathLike) -> dict | None:
    data = _store(checkpoint_uri).read(MANIFEST)
    if data is None:
        return None
    try:
        return json.loads(data)
    except ValueError:
        return None


# --- verify -----------------------------------------------------------------------------


@dataclass
class Verification:
    good: bool
    reasons: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return self.good


def _check(manifest: dict | None, listing: dict[str, ObjectStat], bad: bytes | None) -> list[str]:
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
        return json.loads(data).get("reason", "")
    except ValueError:
        return data.decode(errors="replace")


def verify(checkpoint_uri: str | os.PathLike, deep: bool = False) -> Verification:
    """Is this checkpoint good? `deep` also re-reads every object and compares checksums."""
    store = _store(checkpoint_uri)
    listing = store.list()
    manifest = read_manifest(checkpoint_uri) if MANIFEST in listing else None
    bad = store.read(BAD_MARKER) if BAD_MARKER in listing else None
    reasons = _check(manifest, listing, bad)
    if deep and not reasons:
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
    manifest: dict | None = None
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


def list_checkpoints(prefix: str | os.PathLike, recorded: Recorded | None = None) -> list[CheckpointInfo]:
    """Every checkpoint under `prefix`, oldest first (by step, then attempt), with its (shallow)
    state. `recorded`: the control plane's record, which a good checkpoint must be in (fencing).

    One listing of the prefix plus one GET per manifest.
    """
    store = _store(prefix)
    out = []
    groups = _group(store.list())
    for step, attempt in sorted(groups, key=lambda k: (k[0], -1 if k[1] is None else k[1])):
        base, listing = groups[(step, attempt)]
        uri = _join(prefix, base)
        manifest = read_manifest(uri) if MANIFEST in listing else None
        bad = store.read(f"{base}/{BAD_MARKER}") if BAD_MARKER in listing else None
        reasons = _check(manifest, listing, bad)
        if bad is not None:
            state = CheckpointState.BAD
        elif manifest is None:
            state = CheckpointState.INCOMPLETE
        else:
            state = CheckpointState.CORRUPT if reasons else CheckpointState.GOOD
        state, reasons = _apply_record(state, reasons, uri, recorded)
        size = sum(s.size for s in listing.values())
        keys = [f"{base}/{rel}" for rel in sorted(listing)]
        out.append(CheckpointInfo(uri, step, str(state), reasons, manifest, size, attempt, keys))
    return out


def last_good(prefix: str | os.PathLike, deep: bool = False, recorded: Recorded | None = None) -> str | None:
    """URI of the newest good checkpoint under `prefix` (None if there is none). With `recorded`,
    only one the control plane recorded as good (a superseded attempt's commit never is)."""
    for info in reversed(list_checkpoints(prefix, recorded)):
        if info.good and (not deep or verify(info.uri, deep=True).good):
            return info.uri
    return None


def mark_bad(checkpoint_uri: str | os.PathLike, reason: str) -> None:
    """Flag a checkpoint as not to be resumed from. Writes a `BAD` object; deletes nothing."""
    body = json.dumps({"reason": reason, "marked_at": time.time()}).encode()
    _store(checkpoint_uri).write(BAD_MARKER, body)


# --- garbage collection ---------------------------------------------------------------


def gc(
    prefix: str | os.PathLike,
    keep_last: int = 3,
    keep_every: int = 0,
    protect: Iterable[str | int] = (),
    dry_run: bool = False,
    recorded: Recorded | None = None,
) -> list[str]:
    """Delete old checkpoints; returns the URIs deleted.

    Kept: the newest `keep_last` good checkpoints, good ones whose step is a multiple of
    `keep_every` (0: none), anything in `protect` (URIs or steps), the newest good one
    (always), and everything newer than it (a save may be in progress there). Deleted:
    the other checkpoints older than the newest good one, including bad, corrupt and
    incomplete ones (a superseded attempt's unrecorded commits, with `recorded`).
    """
    infos = list_checkpoints(prefix, recorded)
    good = [i for i in infos if i.good]
    if not good:
        return []  # nothing known-good: deleting anything could lose the only resume point
    newest_good = good[-1]
    protected = {str(p).rstrip("/") for p in protect if not isinstance(p, int)}
    protected_steps = {p for p in protect if isinstance(p, int)}
    keep = {i.uri for i in good[-keep_last:]} if keep_last > 0 else set()
    keep.add(newest_good.uri)
    if keep_every > 0:
        keep.update(i.uri for i in good if i.step % keep_every == 0)
    store = _store(prefix)
    deleted = []
    for info in infos:
        if info.ref.key >= newest_good.ref.key or info.uri in keep:
            continue
        if info.uri.rstrip("/") in protected or info.step in protected_steps:
            continue
        if not dry_run:
            # The manifest goes first: a half-deleted checkpoint must never look good.
            keys = sorted(info.keys, key=lambda k: not k.endswith("/" + MANIFEST))
            store.delete(keys[:1])
            _failpoint("gc.after_manifest_delete")
            store.delete(keys[1:])
        deleted.append(info.uri)
    return deleted


def _failpoint(name: str) -> None:
    """Crash tests: die here when AERIE_FAILPOINT names this place (see orchestrator/failpoints.py;
    repeated because this module ships alone to AWS Lambda)."""
    if os.environ.get(env.FAILPOINT) == name:
        os.kill(os.getpid(), 9)


# --- incomplete multipart uploads (a save that died mid-upload) ----------------------


def list_incomplete_uploads(prefix: str | os.PathLike) -> list[dict]:
    """Multipart uploads started under `prefix` and never completed: [{key, upload_id, initiated}]."""
    if not s3io.is_s3(prefix):
        return []
    bucket, key = s3io.parse_uri(str(prefix))
    client = s3io.boto3_client()
    out = []
    for page in client.get_paginator("list_multipart_uploads").paginate(Bucket=bucket, Prefix=key):
        for up in page.get("Uploads", []):
            out.append({"key": up["Key"], "upload_id": up["UploadId"], "initiated": up.get("Initiated")})
    return out


def abort_incomplete_uploads(prefix: str | os.PathLike, older_than_s: float = 0.0) -> list[dict]:
    """Abort the incomplete multipart uploads under `prefix` (their parts cost storage).

    `older_than_s` spares uploads started recently, which may belong to a save still
    running (servers that report no start time are treated as old).
    """
    if not s3io.is_s3(prefix):
        return []
    bucket, _ = s3io.parse_uri(str(prefix))
    client = s3io.boto3_client()
    aborted = []
    now = time.time()
    for up in list_incomplete_uploads(prefix):
        initiated = up["initiated"]
        if older_than_s and initiated is not None and now - initiated.timestamp() < older_than_s:
            continue
        try:
            client.abort_multipart_upload(Bucket=bucket, Key=up["key"], UploadId=up["upload_id"])
        except client.exceptions.NoSuchUpload:
            continue
        aborted.append(up)
    return aborted
