"""Checkpoint garbage collection: the retention policy, and the multipart uploads of dead saves.

`prune()` deletes old checkpoints under a prefix (keep_last / keep_every / protect; never the
newest good checkpoint, never anything newer), manifest first so a half-deleted checkpoint never
looks good. `abort_incomplete_uploads()` aborts multipart uploads left behind by saves that died,
sparing recent ones that may belong to a save in progress. `collect()` does both, for operators:

    python -m aerie_checkpoint.gc s3://bucket/ckpt/JOB --keep-last 3 --keep-every 1000 [--dry-run]

Torch-free, like `manifest`: the `checkpoint_gc` Lambda handler calls `prune` with the control
plane's record (`recorded`, see `manifest`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterable
from typing import Any

from aerie_checkpoint import manifest
from aerie_checkpoint.storage import open_store
from aerie_contracts import env
from aerie_s3.clients import boto3_client
from aerie_s3.settings import is_s3, parse_uri


def prune(
    prefix: str | os.PathLike[str],
    keep_last: int = 3,
    keep_every: int = 0,
    protect: Iterable[str | int] = (),
    dry_run: bool = False,
    recorded: manifest.Recorded | None = None,
) -> list[str]:
    """Delete old checkpoints; returns the URIs deleted.

    Kept: the newest `keep_last` good checkpoints, good ones whose step is a multiple of
    `keep_every` (0: none), anything in `protect` (URIs or steps), the newest good one
    (always), and everything newer than it (a save may be in progress there). Deleted:
    the other checkpoints older than the newest good one, including bad, corrupt and
    incomplete ones (a superseded attempt's unrecorded commits, with `recorded`).
    """
    infos = manifest.list_checkpoints(prefix, recorded)
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
    store = open_store(prefix)
    deleted = []
    for info in infos:
        if info.ref.key >= newest_good.ref.key or info.uri in keep:
            continue
        if info.uri.rstrip("/") in protected or info.step in protected_steps:
            continue
        if not dry_run:
            # The manifest goes first: a half-deleted checkpoint must never look good.
            keys = sorted(info.keys, key=lambda k: not k.endswith("/" + manifest.MANIFEST))
            store.delete(keys[:1])
            _failpoint("gc.after_manifest_delete")
            store.delete(keys[1:])
        deleted.append(info.uri)
    return deleted


def _failpoint(name: str) -> None:
    """Crash tests: die here when AERIE_FAILPOINT names this place. The same three lines as
    orchestrator/failpoints.py, kept apart on purpose: this module ships to AWS Lambda, which gets
    `aerie_contracts` and the torch-free checkpoint modules but not `orchestrator`."""
    if os.environ.get(env.FAILPOINT) == name:
        os.kill(os.getpid(), 9)


# --- incomplete multipart uploads (a save that died mid-upload) ----------------------


def list_incomplete_uploads(prefix: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Multipart uploads started under `prefix` and never completed: [{key, upload_id, initiated}]."""
    if not is_s3(prefix):
        return []
    bucket, key = parse_uri(str(prefix))
    client = boto3_client()
    out = []
    for page in client.get_paginator("list_multipart_uploads").paginate(Bucket=bucket, Prefix=key):
        for up in page.get("Uploads", []):
            out.append({"key": up["Key"], "upload_id": up["UploadId"], "initiated": up.get("Initiated")})
    return out


def abort_incomplete_uploads(prefix: str | os.PathLike[str], older_than_s: float = 0.0) -> list[dict[str, Any]]:
    """Abort the incomplete multipart uploads under `prefix` (their parts cost storage).

    `older_than_s` spares uploads started recently, which may belong to a save still
    running (servers that report no start time are treated as old).
    """
    if not is_s3(prefix):
        return []
    bucket, _ = parse_uri(str(prefix))
    client = boto3_client()
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


def collect(
    prefix: str,
    keep_last: int = 3,
    keep_every: int = 0,
    protect: Iterable[str | int] = (),
    abort_uploads_older_than_s: float | None = 3600.0,
    dry_run: bool = False,
) -> dict[str, Any]:
    """Delete what the policy lets go; returns {"deleted": [...], "aborted_uploads": [...]}."""
    deleted = prune(prefix, keep_last=keep_last, keep_every=keep_every, protect=protect, dry_run=dry_run)
    aborted: list[dict[str, Any]] = []
    if abort_uploads_older_than_s is not None:
        if dry_run:
            aborted = list_incomplete_uploads(prefix)
        else:
            aborted = abort_incomplete_uploads(prefix, older_than_s=abort_uploads_older_than_s)
    return {"deleted": deleted, "aborted_uploads": [u["key"] for u in aborted], "dry_run": dry_run}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m aerie_checkpoint.gc", description=__doc__.split("\n")[0])
    p.add_argument("prefix", help="s3://bucket/prefix or a local path holding step_XXXXXXXX/ directories")
    p.add_argument("--keep-last", type=int, default=3)
    p.add_argument("--keep-every", type=int, default=0)
    p.add_argument("--protect", action="append", default=[], help="a checkpoint URI or step to keep (repeatable)")
    p.add_argument(
        "--abort-older-than",
        type=float,
        default=3600.0,
        help="abort incomplete multipart uploads older than this many seconds (-1: leave them)",
    )
    p.add_argument("--dry-run", action="store_true")
    args = p.parse_args(argv)
    protect = [int(x) if x.isdigit() else x for x in args.protect]
    result = collect(
        args.prefix,
        args.keep_last,
        args.keep_every,
        protect,
        None if args.abort_older_than < 0 else args.abort_older_than,
        args.dry_run,
    )
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
