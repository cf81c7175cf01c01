"""The stage the S3 benches share: loopback S3 (moto) in a scratch directory and, once a bench has
measured the uncapped link, the throttling proxy in front of it; `close` takes it all down."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from devtools.devstack import S3Server
from devtools.s3proxy import ProxyProcess


class S3Stage:
    def __init__(self, prefix: str):
        self.work = Path(tempfile.mkdtemp(prefix=prefix))
        self.server = S3Server.start(log_path=self.work / "moto.log")
        self.proxy: ProxyProcess | None = None

    def throttle(self, cap: float) -> ProxyProcess:
        """The per-connection token-bucket proxy at `cap` bytes/s (its stats in proxy-stats.json)."""
        self.proxy = ProxyProcess("127.0.0.1", self.server.port, cap, str(self.work / "proxy-stats.json"))
        return self.proxy

    def close(self) -> None:
        if self.proxy:
            self.proxy.stop()
        self.server.stop()
        shutil.rmtree(self.work, ignore_errors=True)
