"""A torch-free stand-in for one training rank, for probe tests and trace recording.

It does what a real rank does as far as the agent can see: burns CPU while it "computes",
exchanges bytes with its peers over TCP each step (a star all-reduce: every rank blocks until
rank 0 has heard from everyone), appends the metrics stream, writes ``rank-<R>.pid``, and can
misbehave on cue: stop itself, spin forever, log NaN or spiking losses, idle its "device",
stall in the data loader, pause for checkpoints and eval.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import signal
import socket
import time
from pathlib import Path


def burn(seconds: float) -> None:
    """Compute for ``seconds`` of CPU time (like a kernel's fixed device time, however busy the host)."""
    end = time.process_time() + seconds
    x = 0
    while time.process_time() < end:
        x += 1


def recv_exact(sock: socket.socket, n: int) -> None:
    view = memoryview(bytearray(n))
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise ConnectionError("peer closed")
        got += k


def connect_peers(args) -> list[socket.socket]:
    if args.world == 1:
        return []
    if args.rank == 0:
        srv = socket.socket()
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind((args.addr, args.port))
        srv.listen(args.world)
        peers = [srv.accept()[0] for _ in range(args.world - 1)]
        srv.close()
        return peers
    deadline = time.time() + 30
    while True:
        try:
            return [socket.create_connection((args.addr, args.port), timeout=None)]
        except OSError:
            if time.time() > deadline:
                raise
            time.sleep(0.1)


def all_reduce(peers: list[socket.socket], rank: int, nbytes: int) -> None:
    payload = b"\x01" * nbytes
    if rank == 0:
        for p in peers:
            recv_exact(p, nbytes)
        for p in peers:
            p.sendall(payload)
    else:
        peers[0].sendall(payload)
        recv_exact(peers[0], nbytes)


# Faults and pauses, in seconds (0: never). They fire at a time (seconds after step 1), not a step:
# on a busy host the step rate varies too much for a step number to land inside a short recording.
TIMED = {
    "eval-after": "pause for an evaluation once (eval_begin/eval_end)",
    "eval-s": "how long the evaluation lasts",
    "hiccup-after": "stall once before a step (the data loader)",
    "hiccup-s": "how long the stall lasts",
    "nan-after": "log NaN loss from then on",
    "spike-after": "log the loss x4 from then on",
    "spin-after": "spin at full CPU forever, never finish the step",
    "stop-after": "SIGSTOP itself",
    "idle-after": "stop computing (sleep instead), keep stepping",
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--world", type=int, default=1)
    ap.add_argument("--metrics", type=Path, required=True)
    ap.add_argument("--pid-dir", type=Path)
    ap.add_argument("--addr", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--bytes", type=int, default=0, help="bytes each rank sends per step")
    ap.add_argument("--steps", type=int, default=10**9)
    ap.add_argument("--compute-s", type=float, default=0.1, help="CPU burnt per step")
    ap.add_argument("--wait-s", type=float, default=0.0, help="sleep per step (I/O, host work)")
    ap.add_argument("--start-delay", type=float, default=0.0, help="start-up before step 1 (imports, compile)")
    ap.add_argument("--slow-first", default="", help="comma list of extra seconds burnt in the first steps")
    ap.add_argument("--ckpt-every", type=int, default=0)
    ap.add_argument("--ckpt-s", type=float, default=0.0)
    for name, what in TIMED.items():
        ap.add_argument(f"--{name}", type=float, default=0.0, help=what)
    args = ap.parse_args()

    signal.signal(signal.SIGTERM, lambda *_: os._exit(143))
    if args.pid_dir:
        args.pid_dir.mkdir(parents=True, exist_ok=True)
        tmp = args.pid_dir / f".rank-{args.rank}.pid.tmp"
        tmp.write_text(str(os.getpid()))
        os.replace(tmp, args.pid_dir / f"rank-{args.rank}.pid")
    args.metrics.mkdir(parents=True, exist_ok=True)
    out = open(args.metrics / f"rank-{args.rank:05d}.jsonl", "a", buffering=1)
    rnd = random.Random(args.rank)
    slow = [float(x) for x in args.slow_first.split(",") if x]
    time.sleep(args.start_delay)
    peers = connect_peers(args)

    def emit(**rec) -> None:
        base = {
            "t": round(time.time(), 3),
            "rank": args.rank,
            "step": None,
            "loss": None,
            "grad_norm": None,
            "lr": None,
            "tokens": None,
            "step_s": None,
            "event": None,
        }
        base.update(rec)
        out.write(json.dumps(base) + "\n")

    t_first = None
    done: set[str] = set()

    def due(name: str, after: float, once: bool = True) -> bool:
        if not after or t_first is None or time.time() - t_first < after or (once and name in done):
            return False
        done.add(name)
        return True

    for step in range(1, args.steps + 1):
        t0 = time.time()
        if due("stop", args.stop_after):
            os.kill(os.getpid(), signal.SIGSTOP)
        if due("spin", args.spin_after):
            while True:
                burn(1.0)
        if due("hiccup", args.hiccup_after):
            time.sleep(args.hiccup_s)  # the data loader stalls; the device waits
        if due("idle", args.idle_after, once=False):
            time.sleep(args.compute_s)
        else:
            burn(args.compute_s + (slow[step - 1] if step <= len(slow) else 0.0))
        if args.wait_s:
            time.sleep(args.wait_s)
        if peers:
            all_reduce(peers, args.rank, args.bytes)
        loss = 2.0 + 3.0 * math.exp(-step / 150) + rnd.gauss(0, 0.02)
        if due("spike", args.spike_after, once=False):
            loss *= 4
        if due("nan", args.nan_after, once=False):
            loss = float("nan")
        emit(
            step=step,
            loss=round(loss, 5) if math.isfinite(loss) else loss,
            grad_norm=1.0,
            lr=3e-4,
            tokens=step * 4096,
            step_s=round(time.time() - t0, 4),
        )
        t_first = t_first or time.time()
        if args.ckpt_every and step % args.ckpt_every == 0:
            emit(step=step, event="checkpoint_begin")
            time.sleep(args.ckpt_s)  # writing shards: no compute, no collectives
            emit(step=step, event="checkpoint_end")
            emit(step=step, event="checkpoint_committed", uri=f"file:///tmp/ckpt/{step}")
        if due("eval", args.eval_after):
            emit(step=step, event="eval_begin")
            burn(args.eval_s * 0.1)
            time.sleep(args.eval_s * 0.9)
            emit(step=step, event="eval_end")


if __name__ == "__main__":
    main()
