"""Checkpoint garbage collection as one call (and a command), for handlers and operators.

`collect()` applies the retention policy of `manifest.gc` (keep_last / keep_every /
protect; never the newest good checkpoint, never anything newer) and aborts multipart
uploads left behind by saves that died, sparing recent ones that may belong to a save in
progress. Torch-free, like `manifest`.

    python -m trainer.checkpoint.gc s3://bucket/ckpt/JOB --keep-last 3 --keep-every 1000 [--dry-run]
"""

from __future__ import annotations

import argparse
import json
import sys

from trainer.checkpoint import manifest


def collect(
    prefix: str,
    keep_last: int = 3,
    keep_every: int = 0,
    protect: list[str | int] = (),
    abort_uploads_older_than_s: float | None = 3600.0,
    dry_run: bool = False,
) -> dict:
    """Delete what the policy lets go; returns {"deleted": [...], "aborted_uploads": [...]}."""
    deleted = manifest.gc(prefix, keep_last=keep_last, keep_every=keep_every, protect=protect, dry_run=dry_run)
    aborted: list[dict] = []
    if abort_uploads_older_than_s is not None:
        if dry_run:
            aborted = manifest.list_incomplete_uploads(prefix)
        else:
            aborted = manifest.abort_incomplete_uploads(prefix, older_than_s=abort_uploads_older_than_s)
    return {"deleted": deleted, "aborted_uploads": [u["key"] for u in aborted], "dry_run": dry_run}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m trainer.checkpoint.gc", description=__doc__.split("\n")[0])
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
