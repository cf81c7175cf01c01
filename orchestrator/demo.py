"""`make demo`: run the main job end to end on the embedded defaults and say where to look.

Starts a control plane (`aerie up`, SQLite under ~/.aerie), submits the demo job through the CLI
exactly as a user would and follows it to the end, rehearsing two faults (examples/demo.yaml): a
silent hang the memory tier recovers in place, then — once the restarted attempt has trained a
while — the loss of a whole node (`aerie chaos --fault node-loss`), which a hot spare replaces.
Then it tells what each recovery cost (the seconds from detection to the first step, the steps
redone) and prints the commands to inspect the job. The control plane it started is stopped at the
end; the job's files stay.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from aerie_contracts import env as aerie_env
from aerie_contracts.checkpoints import CheckpointTier
from aerie_contracts.restarts import CAUSE_MODE, CAUSE_REPLACED_NODES
from aerie_contracts.states import JOB_TERMINAL, AttemptState
from orchestrator import follow
from orchestrator.client import ApiError, Client
from orchestrator.settings import Settings

REPO = Path(__file__).resolve().parent.parent
DEMO_SPEC = REPO / "examples" / "demo.yaml"
# The silent failure the demo rehearses: rank 1 spins without finishing step 100.
DEMO_FAULT = "busy_hang@100:rank=1"
# The second fault: once attempt 2 has a good memory checkpoint of this step or later, newer than
# S3's last by at least MEMORY_LEAD steps, its second node (algo-2) is lost. The restart point is
# that memory checkpoint: the spare restores algo-2's ranks from the replicas algo-1 holds.
MEMORY_LEAD = 5
NODE_LOSS_ATTEMPT, NODE_LOSS_AFTER_STEP, NODE_LOSS_NODE = 2, 180, 1


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


def _lose_a_node_later(aerie: list[str], env: dict[str, str], name: str, done: threading.Event) -> None:
    """Once attempt 2 runs and its memory checkpoint of NODE_LOSS_AFTER_STEP is good, take its
    node NODE_LOSS_NODE away, through the CLI as a user would rehearse it."""
    try:
        client = Client(env[aerie_env.API])
    except ApiError:
        return
    while not done.wait(1.0):
        try:
            job = client.job(name)
            attempts = job["attempt_list"]
            if len(attempts) > NODE_LOSS_ATTEMPT or job["state"] in JOB_TERMINAL:
                return
            if len(attempts) < NODE_LOSS_ATTEMPT or attempts[-1]["state"] != AttemptState.RUNNING:
                continue
            own = f"/attempt_{NODE_LOSS_ATTEMPT:04d}"
            rows = [c for c in client.checkpoints(name) if c["state"] == "good"]
        except ApiError:
            continue
        good = [c["step"] for c in rows if c["tier"] == CheckpointTier.MEMORY and c["uri"].endswith(own)]
        durable = max((c["step"] for c in rows if c["tier"] == CheckpointTier.S3), default=0)
        if good and max(good) >= NODE_LOSS_AFTER_STEP and max(good) >= durable + MEMORY_LEAD:
            command = ["chaos", name, "--node", str(NODE_LOSS_NODE), "--fault", "node-loss"]
            print(
                f"==> memory checkpoint of step {max(good)} is good: a whole node goes away "
                f"(aerie {' '.join(command)}: its agent and ranks die at once, its memory is gone)",
                flush=True,
            )
            subprocess.call([*aerie, *command], env=env, cwd=REPO)
            return


def _story(client: Client, name: str) -> None:
    """Each failure, its recovery and what it cost, from the API (the goodput ledger's faults)."""
    try:
        job = client.job(name)
        faults = {f["attempt"]: f for f in client.goodput(name)["faults"]}
    except ApiError as exc:
        print(f"    (no recovery summary: {exc})")
        return
    attempts = {a["number"]: a for a in job["attempt_list"]}
    print("==> what happened")
    for number in sorted(attempts):
        a, nxt = attempts[number], attempts.get(number + 1)
        if nxt is None:
            continue
        f = faults.get(number) or {}
        host, _ = follow.root_cause(job, a)  # the blamed node, not the first report
        cause = nxt.get("cause") or {}
        how = str(cause.get(CAUSE_MODE, "relaunch")).replace("_", " ")
        swaps = ", ".join(
            f"{spare} took {lost}'s slot" for lost, spare in (cause.get(CAUSE_REPLACED_NODES) or {}).items()
        )
        took = f"{f['recovery_s']:.1f}s from detection to the first step" if f.get("recovery_s") is not None else ""
        redone = f"{f.get('redone_steps', 0)} step(s) redone"
        kind = (a.get("reason") or {}).get("kind") or "a failure"
        print(
            f"  attempt {number}: {kind} on {host or '?'} -> attempt {nxt['number']} "
            f"{how}{f' ({swaps})' if swaps else ''}, resumed from {nxt.get('resume_from') or 'nothing'}"
        )
        print(f"      {', '.join(x for x in (took, redone) if x)}")


def main() -> int:
    settings = Settings()
    aerie = [sys.executable, "-m", "orchestrator.cli"]
    port = settings.port if settings.port and _port_free(settings.host, settings.port) else _free_port()
    url = f"http://{settings.host}:{port}"
    env = {**os.environ, aerie_env.API: url}
    print(f"==> starting the control plane on {url} (store {settings.db_url})", flush=True)
    up = subprocess.Popen([*aerie, "up", "--port", str(port)], env=env, cwd=REPO)
    done = threading.Event()
    try:
        _wait_healthy(url, up)
        name = f"demo-{time.strftime('%H%M%S')}"
        print(f"==> aerie submit {DEMO_SPEC.relative_to(REPO)} --name {name} --fault {DEMO_FAULT} --follow", flush=True)
        print(
            "    (2 nodes x 2 ranks and a hot spare; checkpoints every 50 steps to the loopback S3 server and "
            "every few steps to memory. At step 100 rank 1 spins without progress: watch the agent catch it and "
            f"the job restart in place. After step {NODE_LOSS_AFTER_STEP} a whole node is lost: watch the spare "
            "take its place.)",
            flush=True,
        )
        print(
            f"    in a browser: {url}/ui/jobs (sign in with the admin token in {settings.admin_token_path})", flush=True
        )
        started = time.time()
        chaos = threading.Thread(target=_lose_a_node_later, args=(aerie, env, name, done), daemon=True)
        chaos.start()
        rc = subprocess.call(
            [*aerie, "submit", str(DEMO_SPEC), "--name", name, "--fault", DEMO_FAULT, "--follow"], env=env, cwd=REPO
        )
        done.set()
        print(f"==> the job ended in {time.time() - started:.0f}s; its history:", flush=True)
        _story(Client(url), name)
        subprocess.call([*aerie, "describe", name], env=env, cwd=REPO)
        subprocess.call([*aerie, "checkpoints", name], env=env, cwd=REPO)
        print("\nWhere to look (start `aerie up` again first, or keep one running in another shell):")
        for cmd in ("describe", "events", "goodput", "logs", "checkpoints"):
            print(f"  .venv/bin/aerie {cmd} {name}")
        print(
            f"  the dashboard: http://{settings.host}:<port>/ui/jobs while `aerie up` runs "
            f"(sign in with the token in {settings.admin_token_path})"
        )
        print(f"  job files (contract dirs, node logs, metrics): {settings.jobs_dir}")
        return rc
    finally:
        done.set()
        up.terminate()
        try:
            up.wait(timeout=15)
        except subprocess.TimeoutExpired:
            up.kill()


if __name__ == "__main__":
    sys.exit(main())
