"""A real control plane for end-to-end tests: `aerie up` as a subprocess, the CLI as subprocesses."""

from __future__ import annotations

import json
import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import psutil

from aerie_contracts import DetailType
from aerie_contracts import env as aerie_env
from devtools.harness.wait import wait_for

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_port_block(count: int, low: int = 20000) -> int:
    """The first of `count` consecutive ports free now, all below the kernel's ephemeral range
    (`ip_local_port_range`), for a job whose in-place attempts move its rendezvous port up by one
    each: a port `free_port` hands out is an ephemeral one, and on a loaded host some process's
    outgoing connection took base + 1 before the in-place attempt could listen on it (EADDRINUSE,
    2026-12-04). Below that range only an explicit bind can take one."""
    try:
        high = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        high = 32768
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(low, max(low + count + 1, high - count))
        socks = []
        try:
            for port in range(base, base + count):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError(f"no {count} consecutive free ports in [{low}, {high})")


class ControlPlane:
    def __init__(self, home: Path, extra_env: dict[str, str] | None = None, s3: bool = False, host: str = "127.0.0.1"):
        self.home = home
        self.s3 = s3
        self.host = host
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {
            **os.environ,
            aerie_env.HOME: str(home),
            aerie_env.API: self.url,
            "COLUMNS": "250",
            aerie_env.RECONCILE_INTERVAL_S: "0.3",
            # The nodes' in-memory checkpoints in a shared-memory folder of this control plane's own.
            aerie_env.MEMORY_CHECKPOINT_DIR: f"/dev/shm/aerie-harness-{os.getpid()}-{secrets.token_hex(4)}",
            **(extra_env or {}),
        }
        for var in (aerie_env.TOKEN, aerie_env.DATABASE_URL):
            if var not in (extra_env or {}):
                self.env.pop(var, None)
        self.proc: subprocess.Popen | None = None
        self.log = home / "control-plane.log"

    # --- lifecycle ------------------------------------------------------------------------

    def start(self, timeout_s: float = 60) -> ControlPlane:
        log = open(self.log, "ab")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "orchestrator.cli",
                "up",
                "--host",
                self.host,
                "--port",
                str(self.port),
                "--s3" if self.s3 else "--no-s3",
            ],
            env=self.env,
            cwd=REPO,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"aerie up exited {self.proc.returncode}:\n{self.log.read_text()[-3000:]}")
            try:
                if httpx.get(self.url + "/healthz", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError("aerie up did not become healthy")

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    def cleanup_nodes(self) -> None:
        """Kill every process a test's jobs left behind (agents run in their own sessions), and the
        loopback S3 server `aerie up` started for this home."""
        if self.s3:
            subprocess.run(
                [sys.executable, "-m", "devtools.devstack", "down"],
                env=self.env,
                cwd=REPO,
                capture_output=True,
                timeout=60,
            )
        for proc in psutil.process_iter(["pid", "environ"]):
            try:
                env = proc.info.get("environ") or {}
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            if str(env.get(aerie_env.ML_ROOT, "")).startswith(str(self.home)):
                try:
                    proc.kill()
                except psutil.NoSuchProcess:
                    pass
        shutil.rmtree(self.env[aerie_env.MEMORY_CHECKPOINT_DIR], ignore_errors=True)

    # --- talking to it --------------------------------------------------------------------

    @property
    def token(self) -> str:
        return (self.home / "admin.token").read_text().strip()

    def cli(self, *args: str, timeout: float = 300, check: bool = False) -> subprocess.CompletedProcess:
        r = subprocess.run(
            [sys.executable, "-m", "orchestrator.cli", *args],
            env=self.env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and r.returncode != 0:
            raise AssertionError(f"aerie {' '.join(args)} -> {r.returncode}\n{r.stdout}\n{r.stderr}")
        return r

    def get(self, path: str) -> object:
        r = httpx.get(self.url + path, headers={"Authorization": f"Bearer {self.token}"}, timeout=30)
        r.raise_for_status()
        return r.json()

    def job(self, ref: str) -> dict:
        return self.get(f"/v1/jobs/{ref}")  # type: ignore[return-value]

    def submit(self, spec: Path, name: str, timeout_s: float = 60) -> str:
        """`aerie submit` the spec of job `name`; its id once the control plane lists it."""
        self.cli("submit", str(spec), check=True)
        return wait_for(what="the job", check=lambda: self.job(name)["id"], timeout_s=timeout_s)

    def events(self, ref: str) -> list[dict]:
        return [row["event"] for row in self.get(f"/v1/jobs/{ref}/events")]  # type: ignore[union-attr]

    def wait_state(self, ref: str, states: set[str], timeout_s: float = 180) -> dict:
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            job = self.job(ref)
            if job["state"] in states:
                return job
            time.sleep(0.5)
        raise AssertionError(f"job {ref} did not reach {states}: {json.dumps(self.job(ref))[:2000]}")


@contextmanager
def started_plane(prefix: str, s3: bool = True) -> Iterator[tuple[ControlPlane, Path]]:
    """A control plane started in a fresh work folder (its home is `<work>/home`), for a bench's
    whole run: yields (the plane, the work folder); stopped and its nodes cleaned up after."""
    work = Path(tempfile.mkdtemp(prefix=prefix))
    (work / "home").mkdir()
    cp = ControlPlane(work / "home", s3=s3).start()
    try:
        yield cp, work
    finally:
        cp.stop()
        cp.cleanup_nodes()


def event_story(events: list[dict]) -> list[str]:
    """Events as short words: 'job Submitted', 'attempt 1 Running', ..."""
    out = []
    for e in events:
        d = e["detail"]
        if e["detail-type"] == DetailType.JOB_STATE_CHANGE:
            out.append(f"job {d['state']}")
        elif e["detail-type"] == DetailType.ATTEMPT_STATE_CHANGE:
            out.append(f"attempt {d['attempt']} {d['state']}")
        else:
            out.append(e["detail-type"])
    return out


def job_story(*attempt_ends: str) -> list[str]:
    """The `event_story` of a job whose attempts end in these states, one after the other; the job
    ends as its last attempt does."""
    story = ["job Submitted", "job InProgress"]
    for n, end in enumerate(attempt_ends, 1):
        story += [f"attempt {n} Running", f"attempt {n} {end}"]
    return [*story, f"job {attempt_ends[-1]}"]


# The story of a job that completes on its first attempt.
FIRST_ATTEMPT_STORY = job_story("Completed")


def write_spec(path: Path, **fields) -> Path:
    path.write_text(json.dumps(fields))
    return path
