"""`python -m agent.memckpt --root DIR [--host H] [--port P]`: a standalone replication endpoint
(prints `listening HOST:PORT`); the agent itself will run `ReplicaServer` in its own process."""

from __future__ import annotations

import argparse
import signal
import threading

from agent.memckpt.replicate import ReplicaServer


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m agent.memckpt")
    parser.add_argument("--root", default=None, help="the shared-memory area (default: $AERIE_MEMORY_CHECKPOINT_DIR)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    server = ReplicaServer(args.root, args.host, args.port).start()
    host, port = server.address
    print(f"listening {host}:{port}", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        stop.wait()
    except KeyboardInterrupt:
        pass
    server.close()


if __name__ == "__main__":
    main()
