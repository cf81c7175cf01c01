"""Count requests at the loopback S3 server itself, from moto's request log (one line per request,
`"GET /bucket/key HTTP/1.1" 200`), so a test sees what really reached S3, not what a client says."""

from __future__ import annotations

import re
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from devtools.devstack import S3Server

_LINE = re.compile(r'"(?:\x1b\[[0-9;]*m)*(GET|HEAD|PUT|POST|DELETE) (/[^ ?"]*)(\?[^ "]*)? HTTP')


class CountingS3:
    """A moto server of its own with its request log."""

    def __init__(self, server: S3Server, log: Path):
        self.server, self.log = server, log

    def env(self) -> dict[str, str]:
        return self.server.env()

    def fresh_bucket(self, setenv: Callable[[str, str], None], prefix: str = "t") -> str:
        """Point this process at the server (`setenv`: a monkeypatch's) and make a bucket of its own."""
        for name, value in self.env().items():
            setenv(name, value)
        name = f"{prefix}-{uuid.uuid4().hex[:12]}"
        self.server.create_bucket(name)
        return name

    def mark(self) -> int:
        """A position in the log: count what comes after it."""
        time.sleep(0.2)  # the server logs a request after answering it
        return self.log.stat().st_size

    def requests(self, since: int = 0) -> list[tuple[str, str, str]]:
        """(method, path, query) of every request after `since`."""
        time.sleep(0.2)
        with open(self.log, "rb") as f:
            f.seek(since)
            text = f.read().decode("utf-8", "replace")
        return [(m.group(1), m.group(2), m.group(3) or "") for m in _LINE.finditer(text)]

    def object_gets(self, bucket: str, since: int = 0) -> Counter:
        """GETs of objects (not listings) of `bucket`, per key."""
        prefix = f"/{bucket}/"
        return Counter(
            path[len(prefix) :]
            for method, path, query in self.requests(since)
            if method == "GET" and path.startswith(prefix) and "list-type" not in query
        )
