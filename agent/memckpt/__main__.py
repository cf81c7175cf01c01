"""`python -m agent.memckpt --root DIR [--host H] [--port P]`: a standalone replication endpoint
(prints `listening HOST:PORT`), accepting requests proven with `$AERIE_MEMORY_CHECKPOINT_KEY`
(hex; required); the agent itself runs `ReplicaServer` in its own process."""

from __future__ import annotations

import argparse
import os
import signal
import threading

from aerie_contracts import env as E
from agent.memckpt.replicate import ReplicaServer, parse_key


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m agent.memckpt")
    parser.add_argument("--root", default=None, help="the shared-memory area (default: $AERIE_MEMORY_CHECKPOINT_DIR)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    if not os.environ.get(E.MEMORY_CHECKPOINT_KEY):
        parser.error(f"{E.MEMORY_CHECKPOINT_KEY} is not set (the replication key, hex)")
    key = parse_key(os.environ[E.MEMORY_CHECKPOINT_KEY])
    server = ReplicaServer(args.root, args.host, args.port, key=key).start()
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
