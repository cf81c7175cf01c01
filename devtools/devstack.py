"""The embedded dev stack's S3: moto's server on loopback, as a separate process.

`aerie up` and the test fixtures use this when no S3 endpoint is configured. moto keeps
objects in memory, so data lives as long as the process: the server is started once,
recorded in `$AERIE_HOME/devstack/s3.json`, and reused by later `aerie up` calls while
it answers. `pause()`/`resume()` (SIGSTOP/SIGCONT) make an outage without losing data.
See `../shared/STACK.md` for why moto (s3torchconnector's CRT client works with it).
Torch-free.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from aerie_contracts import env

DEFAULT_BUCKET = "aerie"
# moto's server is not a core dependency of Aerie: it comes with the [stack] extra (and [dev]).
INSTALL_HINT = "pip install 'aerie[stack]'  (from a checkout: pip install -e '.[stack]')"
# moto accepts any credentials; these only need to be non-empty for the SDKs to sign.
DUMMY_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "aerie", "AWS_SECRET_ACCESS_KEY": "aerie-dev-secret"}


def missing() -> list[str]:
    """The modules moto's server needs that this interpreter cannot import: empty when it can run."""
    import importlib.util

    return [name for name in ("moto", "flask", "flask_cors") if importlib.util.find_spec(name) is None]


def aerie_home() -> Path:
    return Path(os.environ.get(env.HOME) or Path.home() / ".aerie")


def state_path() -> Path:
    return aerie_home() / "devstack" / "s3.json"


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class S3Server:
    """One moto server process on `host:port` with `bucket` created.

    Construct with `start()` (a new process) or `attach()` (a running one from the state
    file). `detached=True` puts the server in its own session so it outlives the caller
    (what `aerie up` wants); tests keep it attached and `stop()` it.
    """

    def __init__(self, pid: int, host: str, port: int, bucket: str, owned: bool = True):
        self.pid = pid
        self.host = host
        self.port = port
        self.bucket = bucket
        self.owned = owned  # this object started the process (so stop() reaps it)
        self._proc: subprocess.Popen | None = None

    @property
    def endpoint_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    # --- lifecycle ------------------------------------------------------------------

    @classmethod
    def start(
        cls,
        port: int = 0,
        host: str = "127.0.0.1",
        bucket: str = DEFAULT_BUCKET,
        log_path: str | os.PathLike | None = None,
        detached: bool = False,
        timeout_s: float = 30.0,
        record_state: bool = False,
    ) -> S3Server:
        if absent := missing():
            raise RuntimeError(
                f"the loopback S3 server needs moto's server ({', '.join(absent)} missing): {INSTALL_HINT}"
            )
        port = port or free_port(host)
        log = open(log_path, "ab") if log_path else subprocess.DEVNULL
        proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", host, "-p", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=detached,
        )
        if log_path:
            log.close()
        server = cls(proc.pid, host, port, bucket)
        server._proc = proc
        try:
            server.wait_ready(timeout_s)
            server.create_bucket(bucket)
        except BaseException:
            server.stop()
            raise
        if record_state:
            server.write_state()
        return server

    @classmethod
    def attach(cls) -> S3Server | None:
        """The server recorded in the state file, if it still answers."""
        try:
            st = json.loads(state_path().read_text())
            server = cls(st["pid"], st["host"], st["port"], st["bucket"], owned=False)
        except (OSError, ValueError, KeyError):
            return None
        return server if server.alive() and server._is_moto() and server.answers() else None

    def _is_moto(self) -> bool:
        """Guard against a recycled pid: only ever signal a moto server process."""
        import psutil

        try:
            return "moto.server" in " ".join(psutil.Process(self.pid).cmdline())
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            return False

    def write_state(self) -> None:
        path = state_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(
            json.dumps(
                {
                    "pid": self.pid,
                    "host": self.host,
                    "port": self.port,
                    "bucket": self.bucket,
                    "endpoint_url": self.endpoint_url,
                }
            )
        )
        os.replace(tmp, path)

    def alive(self) -> bool:
        if self._proc is not None:
            return self._proc.poll() is None
        import psutil

        try:  # reap it if it is our child (started by ensure_s3 in this process)
            os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            pass
        try:
            return psutil.Process(self.pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    def answers(self, timeout_s: float = 2.0) -> bool:
        try:
            urllib.request.urlopen(self.endpoint_url + "/moto-api/", timeout=timeout_s).close()
            return True
        except (urllib.error.URLError, OSError):
            return False

    def _listening(self) -> bool:
        """Our process (not some other one on the port) listens on the port."""
        import psutil

        try:
            conns = psutil.Process(self.pid).net_connections(kind="tcp")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            return False
        return any(c.status == psutil.CONN_LISTEN and c.laddr.port == self.port for c in conns)

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.alive():
                raise RuntimeError(f"moto server exited early (pid {self.pid}, port {self.port})")
            if self._listening() and self.answers(timeout_s=1.0):
                return
            time.sleep(0.1)
        raise TimeoutError(f"moto server on {self.endpoint_url} did not answer in {timeout_s} s")

    def stop(self, timeout_s: float = 10.0) -> None:
        """Terminate the server (resuming it first if paused) and forget its state file."""
        if self.alive():
            try:
                os.kill(self.pid, signal.SIGCONT)
                os.kill(self.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            self._wait_exit(timeout_s)
            if self.alive():
                os.kill(self.pid, signal.SIGKILL)
                self._wait_exit(timeout_s)
        try:
            st = json.loads(state_path().read_text())
            if st.get("pid") == self.pid:
                state_path().unlink()
        except (OSError, ValueError):
            pass

    def _wait_exit(self, timeout_s: float) -> None:
        if self._proc is not None:
            try:
                self._proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                pass
            return
        deadline = time.monotonic() + timeout_s
        while self.alive() and time.monotonic() < deadline:
            time.sleep(0.05)

    def pause(self) -> None:
        """Freeze the server (SIGSTOP): connections hang, like an S3 outage; data is kept."""
        os.kill(self.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.pid, signal.SIGCONT)

    def __enter__(self) -> S3Server:
        return self

    def __exit__(self, *exc) -> None:
        if self.owned:
            self.stop()

    # --- use ------------------------------------------------------------------------

    def env(self) -> dict[str, str]:
        """Variables a job needs to reach this server (boto3, s3torchconnector and Aerie)."""
        return {
            env.S3_ENDPOINT: self.endpoint_url,
            "AWS_ENDPOINT_URL": self.endpoint_url,
            "AWS_REGION": "us-east-1",
            "AWS_DEFAULT_REGION": "us-east-1",
            **DUMMY_CREDENTIALS,
            env.S3_BUCKET: self.bucket,
        }

    def client(self):
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            region_name="us-east-1",
            aws_access_key_id=DUMMY_CREDENTIALS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=DUMMY_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
            config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 3}),
        )

    def create_bucket(self, name: str) -> None:
        client = self.client()
        try:
            client.create_bucket(Bucket=name)
        except client.exceptions.BucketAlreadyOwnedByYou:
            pass


def ensure_s3(bucket: str = DEFAULT_BUCKET, log_path: str | os.PathLike | None = None) -> S3Server:
    """For `aerie up`: reuse the recorded server if it answers, else start a detached one."""
    server = S3Server.attach()
    if server is not None:
        if bucket != server.bucket:
            server.create_bucket(bucket)
        return server
    log_path = log_path or aerie_home() / "devstack" / "s3.log"
    Path(log_path).parent.mkdir(parents=True, exist_ok=True)
    return S3Server.start(bucket=bucket, log_path=log_path, detached=True, record_state=True)


def main(argv: list[str] | None = None) -> int:
    """`python -m devtools.devstack {up,down,status,env} [--bucket B]` (used by infra/local/s3-server)."""
    import argparse

    p = argparse.ArgumentParser(prog="s3-server", description="The dev stack's loopback S3 server (moto).")
    p.add_argument("command", choices=["up", "down", "status", "env"])
    p.add_argument("--bucket", default=DEFAULT_BUCKET)
    args = p.parse_args(argv)
    if args.command == "up":
        server = ensure_s3(args.bucket)
        print(f"S3 (moto) at {server.endpoint_url}, bucket {args.bucket}, pid {server.pid}")
        return 0
    server = S3Server.attach()
    if args.command == "down":
        if server:
            server.stop()
            print(f"stopped pid {server.pid}")
        return 0
    if server is None:
        print("no dev S3 server is running", file=sys.stderr)
        return 1
    if args.command == "status":
        print(f"S3 (moto) at {server.endpoint_url}, bucket {server.bucket}, pid {server.pid}")
    else:
        for name, value in server.env().items():
            print(f"export {name}={value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
