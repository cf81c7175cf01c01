"""`make demo`: run the main job end to end on the embedded defaults and say where to look.

Starts a control plane (`aerie up`, SQLite under ~/.aerie) unless one already answers, submits the
demo job through the CLI exactly as a user would, follows it to the end, then prints the commands
to inspect it. The control plane it started is stopped at the end; the job's files stay.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from aerie_contracts import env as aerie_env
from orchestrator.settings import Settings

REPO = Path(__file__).resolve().parent.parent
DEMO_SPEC = REPO / "examples" / "demo.yaml"
# The silent failure the demo rehearses: rank 1 spins without finishing step 150.
DEMO_FAULT = "busy_hang@150:rank=1"


def _port_free(host: str, port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex((host, port)) != 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_healthy(url: str, proc: subprocess.Popen, timeout_s: float = 60) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"`aerie up` exited with code {proc.returncode}; see its output above")
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise SystemExit(f"the control plane did not answer at {url} within {timeout_s:.0f}s")


def main() -> int:
    settings = Settings()
    aerie = [sys.executable, "-m", "orchestrator.cli"]
    port = settings.port if settings.port and _port_free(settings.host, settings.port) else _free_port()
    url = f"http://{settings.host}:{port}"
    env = {**os.environ, aerie_env.API: url}
    print(f"==> starting the control plane on {url} (store {settings.db_url})", flush=True)
    up = subprocess.Popen([*aerie, "up", "--port", str(port)], env=env, cwd=REPO)
    try:
        _wait_healthy(url, up)
        name = f"demo-{time.strftime('%H%M%S')}"
        print(f"==> aerie submit {DEMO_SPEC.relative_to(REPO)} --name {name} --fault {DEMO_FAULT} --follow", flush=True)
        print(
            "    (2 nodes x 2 ranks; checkpoints every 50 steps to the loopback S3 server; at step 150 rank 1 "
            "will spin without progress: watch the agent catch it and the job resume by itself)",
            flush=True,
        )
        print(
            f"    in a browser: {url}/ui/jobs (sign in with the admin token in {settings.admin_token_path})", flush=True
        )
        started = time.time()
        rc = subprocess.call(
            [*aerie, "submit", str(DEMO_SPEC), "--name", name, "--fault", DEMO_FAULT, "--follow"], env=env, cwd=REPO
        )
        print(f"==> the job ended in {time.time() - started:.0f}s; its history:", flush=True)
        subprocess.call([*aerie, "describe", name], env=env, cwd=REPO)
        subprocess.call([*aerie, "events", name], env=env, cwd=REPO)
        subprocess.call([*aerie, "checkpoints", name], env=env, cwd=REPO)
        print("\nWhere to look (start `aerie up` again first, or keep one running in another shell):")
        for cmd in ("describe", "events", "logs", "checkpoints"):
            print(f"  .venv/bin/aerie {cmd} {name}")
        print(
            f"  the dashboard: http://{settings.host}:<port>/ui/jobs while `aerie up` runs "
            f"(sign in with the token in {settings.admin_token_path})"
        )
        print(f"  job files (contract dirs, node logs, metrics): {settings.jobs_dir}")
        return rc
    finally:
        up.terminate()
        try:
            up.wait(timeout=15)
        except subprocess.TimeoutExpired:
            up.kill()


if __name__ == "__main__":
    sys.exit(main())
