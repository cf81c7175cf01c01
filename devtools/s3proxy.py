"""A TCP proxy that caps each accepted connection's bandwidth, like S3 does.

On AWS a single S3 connection tops out near 80-100 MB/s, so a client's checkpoint
throughput is decided by how many connections it keeps busy. On loopback the local
S3 server is the bottleneck instead, which would hide that. Put this proxy in front
of the loopback server and every connection gets its own token bucket (one per
direction), so a benchmark measures the client's parallelism. The kernel here has
no `fq`/`netem`/flow classifier (see STACK.md), hence a userspace proxy.

In-process, `cut()`/`heal()` make an S3 outage (the network path cut: open connections
reset, new ones refused) for crash-safety tests, without touching the server's data.

Use it in-process (`ThrottlingProxy(...).start()` runs an event loop in a thread) or
as a separate process, which keeps it off the benchmark's GIL:

    python devtools/s3proxy.py --target 127.0.0.1:9000 --rate-mb 80 [--listen 127.0.0.1:0]
        [--stats stats.json]

The script prints `listening 127.0.0.1:PORT` once ready; with `--stats` it rewrites
that JSON file every 0.2 s (connections, peak concurrent connections, bytes each way);
SIGUSR1 resets the peak so a caller can measure one phase at a time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import threading
import time
from dataclasses import asdict, dataclass

CHUNK = 64 * 1024


class TokenBucket:
    """Bytes-per-second limiter for one direction of one connection."""

    def __init__(self, rate: float, burst: float | None = None):
        self.rate = float(rate)
        # A small burst keeps the rate smooth at the 50 ms scale; at least one chunk.
        self.burst = float(burst if burst is not None else max(CHUNK, rate * 0.05))
        self.tokens = self.burst
        self.stamp = time.monotonic()

    async def take(self, n: int) -> None:
        while True:
            now = time.monotonic()
            self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
            self.stamp = now
            if self.tokens >= n:
                self.tokens -= n
                return
            await asyncio.sleep((n - self.tokens) / self.rate)


@dataclass
class ProxyStats:
    connections: int = 0  # accepted since start
    active: int = 0
    peak_active: int = 0  # since start or the last reset_peak()
    bytes_up: int = 0  # client -> server
    bytes_down: int = 0  # server -> client


class ThrottlingProxy:
    """Forward `listen` to `target`, each connection capped at `rate` bytes/s per direction.

    `rate=None` (or 0) forwards without a cap, which is useful to count connections.
    """

    def __init__(
        self,
        target_host: str,
        target_port: int,
        rate: float | None,
        listen_host: str = "127.0.0.1",
        listen_port: int = 0,
    ):
        self.target = (target_host, int(target_port))
        self.rate = rate or None
        self.listen_host = listen_host
        self.listen_port = listen_port
        self.stats = ProxyStats()
        self.cut_off = False  # see cut()
        self._writers: set[asyncio.StreamWriter] = set()
        self._buckets: set[TokenBucket] = set()  # of open connections (see set_rate())
        self._server: asyncio.base_events.Server | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    @property
    def endpoint_url(self) -> str:
        return f"http://{self.listen_host}:{self.listen_port}"

    def reset_peak(self) -> None:
        self.stats.peak_active = self.stats.active

    async def serve(self) -> None:
        """Bind and return once listening (the server keeps running on this loop)."""
        self._server = await asyncio.start_server(self._handle, self.listen_host, self.listen_port)
        self.listen_port = self._server.sockets[0].getsockname()[1]

    def cut(self) -> None:
        """An outage: reset every open connection and refuse new ones until heal()."""
        self.cut_off = True
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._close_all)
        else:
            self._close_all()

    def heal(self) -> None:
        self.cut_off = False

    def set_rate(self, rate: float) -> None:
        """Change the cap of every open connection and of new ones (a proxy started with a cap
        only: one started without has no buckets to change). Tests slow one phase down this way."""
        self.rate = float(rate)
        for bucket in list(self._buckets):
            bucket.rate = self.rate
            bucket.burst = max(CHUNK, self.rate * 0.05)

    def _close_all(self) -> None:
        for w in list(self._writers):
            w.transport.abort()

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        if self.cut_off:
            client_w.transport.abort()
            return
        try:
            server_r, server_w = await asyncio.open_connection(*self.target)
        except OSError:
            client_w.close()
            return
        self._writers.update((client_w, server_w))
        s = self.stats
        s.connections += 1
        s.active += 1
        s.peak_active = max(s.peak_active, s.active)
        up = TokenBucket(self.rate) if self.rate else None
        down = TokenBucket(self.rate) if self.rate else None
        self._buckets.update(b for b in (up, down) if b is not None)
        try:
            await asyncio.gather(
                self._pipe(client_r, server_w, up, "bytes_up"),
                self._pipe(server_r, client_w, down, "bytes_down"),
            )
        finally:
            s.active -= 1
            self._buckets.difference_update((up, down))
            for w in (client_w, server_w):
                self._writers.discard(w)
                w.close()

    async def _pipe(self, r, w, bucket: TokenBucket | None, counter: str) -> None:
        try:
            while data := await r.read(CHUNK):
                if bucket:
                    await bucket.take(len(data))
                # Count before writing: a reader on another thread may see the bytes arrive
                # before this coroutine runs again.
                setattr(self.stats, counter, getattr(self.stats, counter) + len(data))
                w.write(data)
                await w.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            try:
                w.write_eof()
            except (OSError, RuntimeError, AttributeError):
                pass

    # --- running in a background thread -------------------------------------------------

    def start(self) -> ThrottlingProxy:
        """Run the proxy's event loop in a daemon thread; returns once it listens."""
        ready = threading.Event()

        def run() -> None:
            self._loop = asyncio.new_event_loop()
            self._loop.run_until_complete(self.serve())
            ready.set()
            self._loop.run_forever()
            self._loop.close()

        self._thread = threading.Thread(target=run, name="s3proxy", daemon=True)
        self._thread.start()
        ready.wait(10)
        return self

    def stop(self) -> None:
        if self._loop is None:
            return

        async def close() -> None:
            self._server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self._loop.stop()

        asyncio.run_coroutine_threadsafe(close(), self._loop)
        self._thread.join(5)
        self._loop = None

    def __enter__(self) -> ThrottlingProxy:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class ProxyProcess:
    """The proxy as a child process (off the caller's GIL), with its counters readable."""

    def __init__(self, target_host: str, target_port: int, rate: float | None, stats_path: str):
        import subprocess
        import sys

        self.stats_path = stats_path
        self.proc = subprocess.Popen(
            [
                sys.executable,
                os.path.abspath(__file__),
                "--target",
                f"{target_host}:{target_port}",
                "--rate-mb",
                str((rate or 0) / 1e6),
                "--stats",
                stats_path,
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        line = self.proc.stdout.readline().split()
        if not line or line[0] != "listening":
            self.proc.kill()
            raise RuntimeError("s3proxy did not start")
        self.listen_host, port = line[1].rsplit(":", 1)
        self.listen_port = int(port)
        self.rate = rate

    @property
    def endpoint_url(self) -> str:
        return f"http://{self.listen_host}:{self.listen_port}"

    def stats(self) -> ProxyStats:
        """Counters as of the last 0.2 s tick."""
        time.sleep(0.25)
        with open(self.stats_path) as f:
            return ProxyStats(**json.load(f))

    def reset_peak(self) -> None:
        self.proc.send_signal(signal.SIGUSR1)
        time.sleep(0.25)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)

    def __enter__(self) -> ProxyProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _hostport(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host or "127.0.0.1", int(port)


async def _main(args: argparse.Namespace) -> None:
    proxy = ThrottlingProxy(
        *_hostport(args.target),
        rate=args.rate_mb * 1e6,
        listen_host=_hostport(args.listen)[0],
        listen_port=_hostport(args.listen)[1],
    )
    await proxy.serve()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGUSR1, proxy.reset_peak)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"listening {proxy.listen_host}:{proxy.listen_port}", flush=True)
    while not stop.is_set():
        if args.stats:
            tmp = args.stats + ".tmp"
            with open(tmp, "w") as f:
                json.dump(asdict(proxy.stats), f)
            os.replace(tmp, args.stats)
        try:
            await asyncio.wait_for(stop.wait(), 0.2)
        except asyncio.TimeoutError:
            pass
    proxy._server.close()
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--target", required=True, help="HOST:PORT of the server")
    p.add_argument("--listen", default="127.0.0.1:0", help="HOST:PORT to listen on (port 0: any)")
    p.add_argument("--rate-mb", type=float, default=80.0, help="cap per connection and direction, MB/s (0: none)")
    p.add_argument("--stats", help="JSON file rewritten every 0.2 s with the proxy's counters")
    asyncio.run(_main(p.parse_args(argv)))


if __name__ == "__main__":
    main()
