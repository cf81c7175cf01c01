"""The measuring half of pre-flight, run as a short-lived subprocess (`python agent/preflight/probe.py
JSON`, a script: it imports no agent package, only the standard library and numpy) beside the
agent's own checks: a matmul burn on each accelerator, then, with more than one node, an
all-reduce of a fixed size across the attempt's nodes and a per-link probe. It measures
only; the agent judges (agent/preflight/__init__.py). The last stdout line is `PREFLIGHT <json>`.

Fast by construction (issue #23, acceptance 3: <= 15 s on a loaded CI host): on a CPU node the
probe never imports torch (2.6 s alone here, 5-10 s beside other work, most of what a pre-flight
took): the burn is numpy's float32 matmul on one BLAS thread, and the collective is plain TCP
between the nodes (the transport gloo uses too) with a ring all-reduce in numpy. Only a GPU node
imports torch, for the CUDA burn.

Rendezvous: node 0 listens on the attempt's master address and port; every node opens a ring
listener of its own and tells node 0 its port (node 0 sees the address it came from); node 0 sends
everyone the table; each node connects to its ring successor. Small exchanges (barriers, the links'
rates) go through node 0.

Per-link probe: node j sends the buffer to its ring successor (j+1) mod n while the others wait,
one link at a time, and the receiver times it; the rates are all-gathered, so node j learns the
rate of its own outgoing link. A link shaped at its sender (netem, a bad NIC's egress) shows on
that link alone, which names the sender: with two nodes an all-reduce alone could not say which.
"""

from __future__ import annotations

import importlib
import json
import os
import socket
import sys
import threading
import time
from typing import Any

MiB = 1024 * 1024
CHUNKS = 8  # the link probe's buffer goes in this many sends (a throttled sender sleeps between them)
TAG = "PREFLIGHT "
ONE_THREAD = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")  # one core's rate


def burn(cfg: dict[str, Any]) -> dict[str, Any]:
    """Each accelerator's matmul rate over `burn_s`: GPUs in TFLOP/s (bf16, torch), else one CPU core
    in GFLOP/s (float32, numpy). `slow_compute` sleeps between matmuls, to a tenth of the minimum."""
    n, burn_s = int(cfg["matrix_n"]), float(cfg["burn_s"])
    if cfg.get("gpus"):
        torch = importlib.import_module("torch")  # a GPU node only: the CUDA burn needs it
        if torch.cuda.is_available():
            rates = {}
            for d in range(torch.cuda.device_count()):
                dev = torch.device("cuda", d)
                a = torch.randn(max(n, 4096), max(n, 4096), device=dev, dtype=torch.bfloat16)
                flops = 2 * a.shape[0] ** 3
                rates[str(d)] = _rate(lambda a=a: a @ a, flops, burn_s, torch.cuda.synchronize, cfg, 1e12)
            return {"gpu_tflops": rates}
    np = importlib.import_module("numpy")
    a = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
    # Per second of this process's CPU time, not of the wall clock: a core shared with other work
    # (a loaded CI host, a busy node) runs the matmuls as fast when it runs them, a slow core does not.
    rate = _rate(lambda: a @ a, 2 * n**3, burn_s, lambda: None, cfg, 1e9, clock=time.process_time)
    return {"cpu_gflops": rate}


def _rate(op, flops: float, burn_s: float, sync, cfg: dict[str, Any], unit: float, clock=time.perf_counter) -> float:
    """`op`'s rate over `burn_s` of wall time, in `unit` FLOP per second of `clock`."""
    op()
    sync()  # warm-up: allocation and kernel selection are not the rate
    slow_to = float(cfg.get("min_rate") or 0) / 10 or 0.05  # slow_compute: a tenth of the minimum
    done, t0, c0 = 0, time.perf_counter(), clock()
    while time.perf_counter() - t0 < burn_s:
        ts = clock()
        op()
        sync()
        done += 1
        if cfg.get("slow_compute"):  # spins rather than sleeps: a slow core's time, on either clock
            while clock() - ts < flops / (slow_to * unit) and time.perf_counter() - t0 < 4 * burn_s:
                pass
    return done * flops / max(clock() - c0, 1e-9) / unit


class Ring:
    """The attempt's nodes over TCP: node 0's control connections (small JSON exchanges) and each
    node's connection to its ring successor (`out`) and from its predecessor (`inn`)."""

    def __init__(self, cfg: dict[str, Any]):
        self.n, self.rank = int(cfg["nodes"]), int(cfg["node_rank"])
        self.deadline = time.monotonic() + float(cfg["timeout_s"])
        self.peers: list[socket.socket] = []  # node 0: the others' control connections, by rank - 1
        ring = socket.create_server(("", 0))
        ring_port = ring.getsockname()[1]
        try:
            if self.rank == 0:
                master = socket.create_server(("", int(cfg["port"])))
                table = {0: [cfg["master_addr"], ring_port]}
                by_rank: dict[int, socket.socket] = {}
                try:
                    while len(by_rank) < self.n - 1:
                        conn, (addr, _) = self._accept(master)
                        hello = self._recv_json(conn)
                        by_rank[int(hello["rank"])] = conn
                        table[int(hello["rank"])] = [addr, int(hello["port"])]
                finally:
                    master.close()
                self.peers = [by_rank[r] for r in range(1, self.n)]
                for c in self.peers:
                    self._send_json(c, table)
            else:
                self.ctl = self._connect(cfg["master_addr"], int(cfg["port"]))
                self._send_json(self.ctl, {"rank": self.rank, "port": ring_port})
                table = {int(k): v for k, v in self._recv_json(self.ctl).items()}
            addr, port = table[(self.rank + 1) % self.n]
            self.out = self._connect(addr, int(port))
            self.inn, _ = self._accept(ring)
        finally:
            ring.close()

    def _left(self) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the collective ran out of its time budget")
        return left

    def _accept(self, server: socket.socket) -> tuple[socket.socket, Any]:
        server.settimeout(self._left())
        conn, addr = server.accept()
        conn.settimeout(self._left())
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return conn, addr

    def _connect(self, addr: str, port: int) -> socket.socket:
        while True:  # the peer may not listen yet
            wait = min(5.0, self._left())  # (raises once the budget is spent)
            try:
                conn = socket.create_connection((addr, port), timeout=wait)
            except OSError:
                time.sleep(0.05)
                continue
            conn.settimeout(self._left())
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return conn

    @staticmethod
    def _send_json(conn: socket.socket, obj: Any) -> None:
        conn.sendall((json.dumps(obj) + "\n").encode())

    @staticmethod
    def _recv_json(conn: socket.socket) -> Any:
        buf = b""
        while not buf.endswith(b"\n"):
            got = conn.recv(65536)
            if not got:
                raise ConnectionError("a peer closed its connection")
            buf += got
        return json.loads(buf)

    def gather(self, obj: Any) -> list[Any]:
        """Every node's `obj`, by rank, on every node (a barrier too)."""
        if self.rank:
            self._send_json(self.ctl, obj)
            return list(self._recv_json(self.ctl))
        got = [obj] + [self._recv_json(c) for c in self.peers]
        for c in self.peers:
            self._send_json(c, got)
        return got

    def recv_into(self, view: memoryview) -> None:
        while view.nbytes:
            got = self.inn.recv_into(view)
            if not got:
                raise ConnectionError("the ring predecessor closed its connection")
            view = view[got:]

    def exchange(self, send: memoryview, recv: memoryview) -> None:
        """Send to the successor while receiving from the predecessor (neither waits for the other)."""
        failed: list[BaseException] = []

        def out() -> None:
            try:
                self.out.sendall(send)
            except BaseException as exc:  # handed to the caller
                failed.append(exc)

        t = threading.Thread(target=out, daemon=True)
        t.start()
        self.recv_into(recv)
        t.join(self._left())
        if failed or t.is_alive():
            raise failed[0] if failed else TimeoutError("sending to the ring successor timed out")

    def close(self) -> None:
        for c in (*self.peers, getattr(self, "ctl", None), getattr(self, "out", None), getattr(self, "inn", None)):
            if c is not None:
                c.close()


def collective(cfg: dict[str, Any]) -> dict[str, Any]:
    np = importlib.import_module("numpy")
    n, rank = int(cfg["nodes"]), int(cfg["node_rank"])
    size = max(CHUNKS * n, int(float(cfg["collective_mb"]) * MiB) // 4 // (CHUNKS * n) * (CHUNKS * n))
    nbytes = size * 4
    throttle = float(cfg.get("throttle_bps") or 0) if cfg.get("slow_link") else 0.0
    t0 = time.perf_counter()
    ring = Ring(cfg)
    joined_s = time.perf_counter() - t0
    try:
        buf = np.ones(size, dtype=np.float32)
        ring.gather(None)  # warm-up: every connection made
        links = [0.0] * n  # links[j]: bytes/s of link j -> (j+1) % n, as its receiver timed it
        for j in range(n):
            ring.gather(None)
            if rank == j:
                for c in np.array_split(buf, CHUNKS):
                    ring.out.sendall(memoryview(c).cast("B"))
                    if throttle:
                        time.sleep(c.nbytes / throttle)
            elif rank == (j + 1) % n:
                ts = time.perf_counter()
                ring.recv_into(memoryview(np.empty_like(buf)).cast("B"))
                links[j] = nbytes / (time.perf_counter() - ts)
        rates = [max(col) for col in zip(*ring.gather(links), strict=True)]  # each link timed by its receiver only
        ring.gather(None)
        ts = time.perf_counter()
        if throttle:
            time.sleep(nbytes / throttle)  # this node's share of the ring passes its slow egress
        _all_reduce(ring, buf, np)
        took = time.perf_counter() - ts
        ok = bool(np.all(np.abs(buf - n) < 1e-3))  # every node's ones arrived
    finally:
        ring.close()
    return {
        "bytes": nbytes,
        "joined_s": round(joined_s, 3),
        "allreduce_s": round(took, 4),
        # bus bandwidth (nccl-tests' convention): what each link carried in a ring all-reduce
        "allreduce_busbw_gbps": round(nbytes * 2 * (n - 1) / n / took * 8 / 1e9, 4),
        "links_gbps": [round(float(r) * 8 / 1e9, 4) for r in rates],
        "sum_ok": ok,
    }


def _all_reduce(ring: Ring, buf: Any, np: Any) -> None:
    """A ring all-reduce (sum) of `buf` in place: n-1 reduce-scatter steps, then n-1 all-gather steps."""
    n, rank = ring.n, ring.rank
    parts = np.array_split(buf, n)  # views into buf
    tmp = np.empty_like(parts[0])
    for step in range(n - 1):
        send, recv = parts[(rank - step) % n], parts[(rank - step - 1) % n]
        ring.exchange(memoryview(send).cast("B"), memoryview(tmp[: recv.size]).cast("B"))
        recv += tmp[: recv.size]
    for step in range(n - 1):
        send, recv = parts[(rank + 1 - step) % n], parts[(rank - step) % n]
        ring.exchange(memoryview(send).cast("B"), memoryview(recv).cast("B"))


def main(argv: list[str]) -> int:
    cfg = json.loads(argv[1])
    for name in ONE_THREAD:
        os.environ[name] = "1"  # before numpy loads its BLAS: one core's rate, comparable across nodes
    t0 = time.perf_counter()
    out: dict[str, Any] = {}
    try:
        importlib.import_module("torch" if cfg.get("gpus") else "numpy")
        missing = None
    except Exception as exc:
        missing = f"not importable: {exc}"
    timings = out["timings"] = {"import_s": round(time.perf_counter() - t0, 3)}  # where the time went
    try:
        out["burn"] = burn(cfg) if missing is None else None
    except Exception as exc:
        out["burn_error"] = f"{type(exc).__name__}: {exc}"
    if missing is not None:
        out["burn_error"] = missing  # compute is skipped, the collective (numpy only) still runs
    timings["burn_s"] = round(time.perf_counter() - t0 - timings["import_s"], 3)
    if int(cfg.get("nodes", 1)) > 1:
        try:
            out["collective"] = collective(cfg)
        except Exception as exc:
            out["collective_error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        timings["collective_s"] = round(time.perf_counter() - t0 - timings["import_s"] - timings["burn_s"], 3)
    print(TAG + json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
