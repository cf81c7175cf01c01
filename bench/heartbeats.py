"""Heartbeat throughput and latency of the API, on PostgreSQL and on SQLite.

Starts `aerie up --api-only` as a real server process on a fresh PostgreSQL database (then on a
SQLite file), registers 2,000 simulated nodes (200 attempts x 10 hosts, each attempt with its own
agent token), and from a separate process sends their heartbeats as fast as the API accepts them
for `--seconds` (32 keep-alive connections, each heartbeat a realistic summary). Prints one JSON line:
accepted heartbeats/s and p50/p99 latency per store (goal on PostgreSQL: >= 2,000/s, p99 < 100 ms
on the 2-core machine; the load generator shares those cores).

    .venv/bin/python bench/heartbeats.py [--seconds 60] [--nodes 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx

from aerie_contracts import env as aerie_env
from aerie_contracts.states import AttemptState

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

PG_ADMIN = os.environ.get(aerie_env.TEST_PG, "postgresql+psycopg://postgres@127.0.0.1:5432/test")
HOSTS_PER_ATTEMPT = 10


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def register_nodes(db_url: str, nodes: int) -> list[tuple[str, str, str]]:
    """(attempt id, host, agent token) for every simulated node, straight into the store."""
    from orchestrator.store import Database, repo

    db = Database(db_url)
    out = []
    with db.session() as s:
        for a in range(nodes // HOSTS_PER_ATTEMPT):
            job = repo.create_job(s, {"name": f"hb-{a}", "backend": "local", "entrypoint": ["x"]}, "default")
            attempt = repo.create_attempt(s, job, 1)
            repo.set_attempt_state(s, attempt, AttemptState.RUNNING)
            token = repo.mint_token(s, "agent", attempt_id=attempt.id)
            out += [(attempt.id, f"algo-{h + 1}", token) for h in range(HOSTS_PER_ATTEMPT)]
    db.dispose()
    return out


def summary(step: int) -> dict:
    return {
        "t": time.time(),
        "accelerators": [{"index": i, "util": random.uniform(90, 100), "mem_used": 7.1e10} for i in range(8)],
        "nics": [{"name": "eth0", "rx_bps": 1.2e10, "tx_bps": 1.1e10}],
        "last_step": step,
        "last_loss": 2.1,
        "step_time_p50": 1.02,
        "step_time_p95": 1.10,
        "in_checkpoint": False,
        "in_eval": False,
        "processes": [{"rank": i, "pid": 1000 + i, "state": "running", "cpu": 99.0} for i in range(8)],
    }


async def _load(url: str, nodes: list, seconds: float, concurrency: int, out: mp.Queue) -> None:
    """Keep-alive HTTP/1.1 over raw asyncio streams: a client cheap enough that the server, not
    the client, is what gets measured (httpx's async pool tops out near 100 req/s here)."""
    host, port = url.removeprefix("http://").split(":")
    latencies: list[float] = []
    errors = 0
    deadline = time.perf_counter() + seconds

    async def worker(offset: int) -> None:
        nonlocal errors
        reader, writer = await asyncio.open_connection(host, int(port))
        i = offset
        while time.perf_counter() < deadline:
            attempt, node, token = nodes[i % len(nodes)]
            i += concurrency
            body = json.dumps(summary(i)).encode()
            head = (
                f"POST /v1/attempts/{attempt}/nodes/{node}/heartbeat HTTP/1.1\r\nHost: {host}\r\n"
                f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n"
            ).encode()
            t0 = time.perf_counter()
            writer.write(head + body)
            status_line = await reader.readline()
            length = 0
            while True:
                line = await reader.readline()
                if line in (b"\r\n", b""):
                    break
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            await reader.readexactly(length)
            if b" 200 " in status_line:
                latencies.append(time.perf_counter() - t0)
            else:
                errors += 1
        writer.close()

    await asyncio.gather(*(worker(k) for k in range(concurrency)))
    out.put((latencies, errors))


def load_process(url: str, nodes: list, seconds: float, concurrency: int, out: mp.Queue) -> None:
    asyncio.run(_load(url, nodes, seconds, concurrency, out))


def run_store(label: str, db_url: str, nodes_n: int, seconds: float, concurrency: int) -> dict:
    nodes = register_nodes(db_url, nodes_n)
    home = Path(tempfile.mkdtemp(prefix=f"aerie-bench-hb-{label}-"))
    port = free_port()
    env = {**os.environ, aerie_env.HOME: str(home), aerie_env.DATABASE_URL: db_url}
    server = subprocess.Popen(
        [sys.executable, "-m", "orchestrator.cli", "up", "--api-only", "--no-s3", "--port", str(port)],
        env=env,
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(200):
            try:
                if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        q: mp.Queue = mp.Queue()
        gen = mp.Process(target=load_process, args=(url, nodes, seconds, concurrency, q))
        gen.start()
        latencies, errors = q.get(timeout=seconds + 120)
        gen.join()
    finally:
        server.terminate()
        server.wait(timeout=20)
    latencies.sort()
    pct = lambda p: latencies[min(len(latencies) - 1, int(p * len(latencies)))] * 1000 if latencies else None  # noqa: E731
    return {
        "accepted_per_s": round(len(latencies) / seconds, 1),
        "errors": errors,
        "p50_ms": round(pct(0.50), 2),
        "p99_ms": round(pct(0.99), 2),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--nodes", type=int, default=2000)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--stores", default="postgres,sqlite", help="comma-separated subset of postgres,sqlite")
    args = p.parse_args()
    stores = set(args.stores.split(","))

    from sqlalchemy import create_engine, text

    pg = sqlite = None
    if "postgres" in stores:
        name = f"aerie_bench_{uuid.uuid4().hex[:8]}"
        admin = create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
        with admin.connect() as c:
            c.execute(text(f'CREATE DATABASE "{name}"'))
        try:
            pg = run_store(
                "postgres", PG_ADMIN.rsplit("/", 1)[0] + f"/{name}", args.nodes, args.seconds, args.concurrency
            )
        finally:
            with admin.connect() as c:
                c.execute(text(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}'"))
                c.execute(text(f'DROP DATABASE IF EXISTS "{name}"'))
    if "sqlite" in stores:
        sqlite = run_store(
            "sqlite", f"sqlite:///{tempfile.mkdtemp()}/aerie.db", args.nodes, args.seconds, args.concurrency
        )
    print(
        json.dumps(
            {
                "bench": "heartbeats",
                "nodes": args.nodes,
                "seconds": args.seconds,
                "concurrency": args.concurrency,
                "cpus": os.cpu_count(),
                "postgres": pg,
                "sqlite": sqlite,
                "goal": {"accepted_per_s": 2000, "p99_ms": 100},
                "meets_goal": bool(pg) and pg["accepted_per_s"] >= 2000 and pg["p99_ms"] < 100,
                "sqlite_vs_postgres": (
                    round(sqlite["accepted_per_s"] / max(pg["accepted_per_s"], 1e-9), 2) if pg and sqlite else None
                ),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
