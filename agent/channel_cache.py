"""The per-host cache of File-mode channel objects, keyed by ETag.

Why: a restarted attempt (the chain's attempt N+1 on the same node, or an in-place restart) must
not pull a multi-terabyte channel again. The cache lives outside any attempt's directory, in
`AERIE_CHANNEL_CACHE` (default `/var/tmp/aerie/channel-cache`, node-local disk that survives
reboots on most distributions; the local backend puts it under `$AERIE_HOME/cache/channels`).
`AERIE_CHANNEL_CACHE=off` downloads straight into the channel directory instead.

Layout: `objects/<kk>/<k>/<etag>` holds the verified bytes of one version of one object (`k` a
hash of endpoint, bucket and key) and `<etag>.json` what was checked; channel directories get
hard links to these files (a copy when the cache is on another file system). An entry is used
only if its record matches the listed ETag and size and the file's size and mtime are those
recorded (a rank that wrote into its channel file through the link invalidates it). When a newer
ETag of a key is cached the older one is deleted, so the cache holds at most one version of each
key it has seen; deleting the directory while no download runs is always safe. Downloads of the
same channel source are serialised by a lock file, so two nodes on one host (the local backend)
download each object once.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from aerie_s3.listing import RemoteObject


def _digest(*parts: str) -> str:
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


class ChannelCache:
    def __init__(self, root: Path, endpoint: str | None):
        self.root = Path(root)
        self.endpoint = endpoint or "aws"

    def _key_dir(self, obj: RemoteObject) -> Path:
        k = _digest(self.endpoint, obj.bucket, obj.key)[:40]
        return self.root / "objects" / k[:2] / k

    def path(self, obj: RemoteObject) -> Path:
        """Where this version of the object lives in the cache (once committed)."""
        return self._key_dir(obj) / _digest(obj.etag, str(obj.size))[:32]

    def lookup(self, obj: RemoteObject) -> Path | None:
        """The cached file of exactly this object version, or None."""
        path = self.path(obj)
        try:
            record = json.loads(path.with_suffix(".json").read_text())
            st = path.stat()
        except (OSError, ValueError):
            return None
        ok = (
            record.get("etag") == obj.etag
            and record.get("size") == obj.size == st.st_size
            and record.get("mtime_ns") == st.st_mtime_ns
        )
        return path if ok else None

    def commit(self, obj: RemoteObject, method: str) -> None:
        """Record a verified download at `path(obj)`; drop the key's older versions."""
        path = self.path(obj)
        st = path.stat()
        record = {
            "bucket": obj.bucket,
            "key": obj.key,
            "etag": obj.etag,
            "size": obj.size,
            "verified": method,
            "mtime_ns": st.st_mtime_ns,
        }
        tmp = path.with_name(path.name + ".json.tmp")
        tmp.write_text(json.dumps(record))
        os.replace(tmp, path.with_suffix(".json"))
        for other in path.parent.iterdir():
            # Older versions go; a `.part` is another download in flight, left alone.
            if other.name.split(".")[0] != path.name and not other.name.endswith(".part"):
                other.unlink(missing_ok=True)

    @contextlib.contextmanager
    def lock(self, source: str) -> Iterator[None]:
        """Exclusive while this host downloads `source` (a channel's URI)."""
        locks = self.root / "locks"
        locks.mkdir(parents=True, exist_ok=True)
        with open(locks / f"{_digest(self.endpoint, source)[:32]}.lock", "w") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)


def place(src: Path, dest: Path) -> None:
    """Put `src` at `dest`: a hard link (no copy, no extra disk), or a copy across file systems."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        if os.path.samefile(src, dest):
            return
    except OSError:
        pass
    tmp = dest.with_name(dest.name + ".aerie-link")
    tmp.unlink(missing_ok=True)
    try:
        os.link(src, tmp)
    except OSError as exc:
        if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.EACCES):
            raise
        shutil.copyfile(src, tmp)
    os.replace(tmp, dest)
