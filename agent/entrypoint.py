"""The container entrypoint: PID 1's job, with the agent as its child.

Kept separate from the agent so that PID 1 stays trivial (reaps, forwards signals, preserves the
exit code) while the agent, which does real work, can crash without taking the container's
signal handling with it. SageMaker reads `/opt/ml/output/failure` after a failed job; the agent
writes it, and this wrapper writes a fallback if the agent died before it could.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from agent.identity import ml_root


def main(argv: list[str]) -> int:
    root = ml_root()  # AERIE_ML_ROOT, else /opt/ml; the agent's directory is derived from it
    agent_dir = root / "agent"
    agent_dir.mkdir(parents=True, exist_ok=True)
    (agent_dir / "entrypoint.pid").write_text(str(os.getpid()))
    agent = subprocess.Popen([sys.executable, "-m", "agent", *argv])

    def forward(signum, _frame):
        try:
            agent.send_signal(signum)
        except ProcessLookupError:
            pass

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1):
        signal.signal(sig, forward)
    code = agent.wait()
    if code != 0:
        failure = root / "output" / "failure"
        if not failure.exists():
            failure.parent.mkdir(parents=True, exist_ok=True)
            failure.write_text(f"agent exited with code {code}\n")
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
