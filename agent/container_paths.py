"""Run a command with `/opt/ml` bound to a node's own directory, as in a SageMaker container.

    unshare --mount --propagation private -- python -m agent.container_paths ML_ROOT -- COMMAND...

SageMaker's training containers see their node at `/opt/ml` (`input/config/resourceconfig.json`,
`input/data/<channel>`, `model/`, `output/failure`, ...), and code written for them — the SageMaker
SDK's own drivers included — uses those absolute paths. The local backend runs several nodes on one
machine, so each node gets a private mount namespace (made by `unshare`) in which this wrapper
binds the node's directory over `/opt/ml`, then replaces itself with the command. Nothing outside
the node's process tree sees the bind. Needs root (or unprivileged user namespaces, then
`unshare --map-root-user`) and creates an empty `/opt/ml` on the host when there is none.
"""

from __future__ import annotations

import ctypes
import os
import sys
import time
from pathlib import Path

from aerie_contracts import FailureKind
from aerie_contracts.container import write_json

TARGET = "/opt/ml"
MS_BIND = 4096  # linux/fs.h
MS_REC = 16384


def bind(source: str, target: str = TARGET) -> None:
    os.makedirs(target, exist_ok=True)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.mount(source.encode(), target.encode(), None, MS_BIND | MS_REC, None) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"cannot bind {source} over {target}: {os.strerror(err)}")


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m agent.container_paths ML_ROOT -- COMMAND [ARGS...]", file=sys.stderr)
        return 2
    root, command = argv[0], argv[2:]
    try:
        bind(root)
    except OSError as exc:
        message = f"container paths: {exc}"
        print(f"agent.container_paths: {message}", file=sys.stderr, flush=True)
        # The node's outcome, as the agent would have written it: the launch failed, and why.
        node_dir = Path(root) / "agent"
        node_dir.mkdir(parents=True, exist_ok=True)
        write_json(
            node_dir / "exit.json",
            {"exit_code": 1, "reason": {"kind": FailureKind.LAUNCH_FAILED, "message": message}, "t": time.time()},
        )
        return 1
    os.execvp(command[0], command)
    return 127  # pragma: no cover - execvp does not return


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
