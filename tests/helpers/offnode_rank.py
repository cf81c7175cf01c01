"""A rank entrypoint whose first attempt runs on "another machine": out of the backend's reach.

Fencing has two halves: kill what the backend can reach, and refuse the writes of what it cannot
(a node behind a partition, a paused VM). On one machine every process is reachable, so a test of
the second half needs a rank the local backend cannot find. In attempt 1 (`AERIE_ATTEMPT_NUMBER`)
this wrapper hands its command and environment to the test over the unix socket `OFFNODE_SOCKET`;
the test starts the rank as its own child, outside the node's process tree and without the node's
`AERIE_ML_ROOT`, and sends back its exit code, which this wrapper exits with. Every other attempt
execs the command in place, an ordinary rank.

    python tests/helpers/offnode_rank.py -- python -m trainer.train --config CFG
"""

from __future__ import annotations

import json
import os
import socket
import sys


def main(argv: list[str]) -> int:
    if argv and argv[0] == "--":
        argv = argv[1:]
    if argv[0] in ("python", "python3"):
        argv = [sys.executable, *argv[1:]]
    path = os.environ.get("OFFNODE_SOCKET")
    if os.environ.get("AERIE_ATTEMPT_NUMBER") != "1" or not path:
        os.execv(argv[0], argv)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.connect(path)
        conn.sendall(json.dumps({"argv": argv, "env": dict(os.environ), "cwd": os.getcwd()}).encode() + b"\n")
        answer = conn.makefile().readline().strip()
    return int(answer) if answer.lstrip("-").isdigit() else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
