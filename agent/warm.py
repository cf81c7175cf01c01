"""Warm worker groups: the next worker group's processes, ready before the last one fails.

On a warm node most of an in-place restart is spent starting Python and importing torch in every
rank — seconds per rank on a loaded host, before the process group, the model or the restore are
even begun. So once a group has trained its first step (not before: the warm-up must not slow its
start), and at the latest when it is failing (a verdict, a rank's death, the control plane saying
the attempt is over), the agent starts its successor's ranks: each imports torch (with
torch.distributed.checkpoint and, for `python -m MODULE`, the module's imports) on the CPU's idle
time only (SCHED_IDLE, where it may switch back), and waits, idle (host memory only: no accelerator
is touched before the go). When an in-place
successor arrives, the agent writes the new group's environment into the *go file*; every rank
takes it and runs the entrypoint (runpy) in its already warm interpreter. A relaunch or the job's
end kills the warm group unused. torch is never imported by the agent itself.

    python -m agent.warm group --go FILE --procs N --node-rank R --nnodes K -- python -m trainer.train ...
    python -m agent.warm rank --go FILE -- python -m trainer.train ...

`group` stands in for torchrun (which would import torch again, and cold): it starts one
`agent.rank` wrapper per local rank with torchrun's variables, ends the others when one fails, and
exits with the first failure's code. Only `python -m MODULE ...` and `python SCRIPT ...` entrypoints
are run warm; anything else starts cold, as before.
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

POLL_S = 0.05  # a waiting rank looks for its go file this often (idle otherwise)
# A group still warming up is waited for (still sooner than a cold start: its torch import is under
# way), this long; the agent heartbeats meanwhile (`take(tick=)`). 15 s was too short on a loaded
# host: a node then started cold beside a warm peer (they cannot rendezvous) after waiting in vain.
READY_WAIT_S = 120.0
TERM_GRACE_S = 10.0
# Set per rank by `group` (torchrun's names); every other variable comes from the go file.
PER_RANK = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "ROLE_NAME",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
)
PYTHONS = ("python", "python3")


def warmable(entrypoint: list[str]) -> bool:
    """Whether `entrypoint` can run in a warm interpreter: `python -m MODULE ...` or `python SCRIPT ...`."""
    if len(entrypoint) < 2 or os.path.basename(entrypoint[0]) not in (*PYTHONS, os.path.basename(sys.executable)):
        return False
    if entrypoint[1] == "-m":
        return len(entrypoint) >= 3
    return not entrypoint[1].startswith("-")


def write_go(path: Path, environ: dict[str, str], group: dict[str, int] | None = None) -> None:
    """Hand the waiting ranks their group's environment (atomically: a rank never reads half), and
    where the group sits (`{"node_rank", "nnodes"}`: a hot spare's group warms up before it knows)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"env": environ, **({"group": group} if group else {})}))
    os.replace(tmp, path)


def rank_env(local: int, procs: int, node_rank: int, nnodes: int) -> dict[str, str]:
    """torchrun's per-rank variables for local rank `local` of node `node_rank`."""
    world = procs * nnodes
    return {
        "RANK": str(node_rank * procs + local),
        "LOCAL_RANK": str(local),
        "WORLD_SIZE": str(world),
        "LOCAL_WORLD_SIZE": str(procs),
        "GROUP_RANK": str(node_rank),
        "GROUP_WORLD_SIZE": str(nnodes),
        "ROLE_RANK": str(node_rank * procs + local),
        "ROLE_WORLD_SIZE": str(world),
        "ROLE_NAME": "default",
        "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": "0",
    }


def regrouped(go: Path, environ: dict[str, str] | os._Environ[str]) -> dict[str, str]:
    """This rank's per-rank variables as the go file's `group` places it ({} without one)."""
    try:
        group = json.loads(go.read_text()).get("group")
        node_rank, nnodes = int(group["node_rank"]), int(group["nnodes"])
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return {}
    return rank_env(int(environ.get("LOCAL_RANK", "0")), int(environ.get("LOCAL_WORLD_SIZE", "1")), node_rank, nnodes)


def wait_go(path: Path, alive=lambda: True) -> dict[str, str] | None:
    """The go file's environment, once it exists; None if `alive()` turns false first."""
    while alive():
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            time.sleep(POLL_S)
            continue
        env = data.get("env") if isinstance(data, dict) else None
        return {str(k): str(v) for k, v in env.items()} if isinstance(env, dict) else {}
    return None


class WarmGroup:
    """The agent's side: at most one warm group at a time, started early (`start`, idempotent),
    then handed its go file (`take`) or killed unused (`discard`)."""

    def __init__(
        self, node_dir: Path, workdir: Path, entrypoint: list[str], *, procs: int, node_rank: int, nnodes: int
    ):
        self.go = node_dir / "warm-go.json"
        self.workdir, self.entrypoint = workdir, list(entrypoint)
        self.procs, self.node_rank, self.nnodes = procs, node_rank, nnodes
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, env: dict[str, str]) -> None:
        if self.proc is not None or not warmable(self.entrypoint):
            return
        for stale in [self.go, *self.go.parent.glob(self.go.name + ".ready-*")]:
            stale.unlink(missing_ok=True)  # the last group's: these ranks must wait for their own
        argv = [sys.executable, "-m", "agent.warm", "group", "--go", str(self.go), "--procs", str(self.procs)]
        argv += ["--node-rank", str(self.node_rank), "--nnodes", str(self.nnodes), "--", *self.entrypoint]
        # Its own session, like a cold group: the agent signals the whole tree at once.
        self.proc = subprocess.Popen(
            argv, cwd=str(self.workdir), env=env, start_new_session=True, stdin=subprocess.DEVNULL
        )

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None and self.proc.poll() is None else None

    def state(self) -> str:
        if self.proc is None:
            return "not started: " + ("no warm group wanted" if warmable(self.entrypoint) else "entrypoint runs cold")
        return f"pid {self.proc.pid}" if self.proc.poll() is None else f"exited {self.proc.returncode}"

    def take(
        self, env: dict[str, str], master_addr: str, master_port: int, tick: Any = None
    ) -> subprocess.Popen[bytes] | None:
        """The warm group, told to run as the group `env` describes; None if there is none alive.
        `tick()` is called about every second while it waits (the agent's heartbeat: a wait of up
        to READY_WAIT_S, plus a discard, may outlast the control plane's lost-node limit)."""
        proc = self.proc
        if proc is None:
            return None
        deadline = time.time() + READY_WAIT_S
        next_tick = time.time() + 1.0
        while proc.poll() is None and len(list(self.go.parent.glob(self.go.name + ".ready-*"))) < self.procs:
            if time.time() > deadline:
                break
            if tick is not None and time.time() >= next_tick:
                tick()
                next_tick = time.time() + 1.0
            time.sleep(POLL_S)
        if tick is not None:
            tick()
        if proc.poll() is not None or len(list(self.go.parent.glob(self.go.name + ".ready-*"))) < self.procs:
            self.discard()  # it died or stalled warming up: a cold start reports why, if it is the code's fault
            return None
        self.proc = None
        group = {"node_rank": self.node_rank, "nnodes": self.nnodes}
        write_go(self.go, {**env, "MASTER_ADDR": master_addr, "MASTER_PORT": str(master_port)}, group)
        return proc

    def discard(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            import psutil

            from agent.proctree import kill_subtree

            tree = kill_subtree(proc.pid)  # its ranks may have sessions of their own
            psutil.wait_procs([p for p in tree if p.pid != proc.pid], timeout=5)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass


# --- one rank ---------------------------------------------------------------------------------


def _preimport(entrypoint: list[str]) -> None:
    """What every rank of a training script imports first, and the slowest: torch."""
    import importlib

    for name in ("torch", "torch.distributed", "torch.distributed.checkpoint"):
        try:
            importlib.import_module(name)
        except Exception:  # a script without torch still runs, cold
            return
    if entrypoint[1] == "-m":
        # The module itself, for everything it imports (a `python -m` module keeps its work under
        # `if __name__ == "__main__"`); then forgotten, so that it runs afresh as __main__.
        try:
            importlib.import_module(entrypoint[2])
        except BaseException:  # the run reports it, not the warm-up
            pass
        sys.modules.pop(entrypoint[2], None)


def _idle_priority() -> bool:
    """Warm up on the CPU's idle time only (SCHED_IDLE), if this process may switch back after:
    the successor's warm-up must not slow the group that trains beside it (on a 2-core host four
    warm ranks importing torch slowed a young group's steps by ~30 %). Root may always switch
    back; anyone else only within RLIMIT_NICE (its default 0 allows no way back from SCHED_IDLE,
    and a rank left there would train on idle time only)."""
    import resource

    try:
        nice = os.getpriority(os.PRIO_PROCESS, 0)
        if os.geteuid() != 0 and resource.getrlimit(resource.RLIMIT_NICE)[0] < 20 - nice:
            return False
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        return True
    except (AttributeError, OSError):  # not Linux, or not allowed: warm up at the usual priority
        return False


def _normal_priority() -> None:
    """Back to the usual scheduling before the rank runs (as every cold rank does)."""
    try:
        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
    except OSError as exc:
        print(f"agent.warm: could not leave idle priority ({exc}); the rank runs on idle CPU time", file=sys.stderr)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def run_rank(go: Path, entrypoint: list[str], group_pid: int | None = None) -> None:
    """Warm up (on idle CPU time), wait for the go file, then become the entrypoint at the usual
    priority (runpy, as `python` would run it)."""
    # Its parent (the rank wrapper) or its group may be killed without a word (SIGKILL, the tree
    # discarded while this rank was still being started, so not found to be killed with it): the
    # rank must not wait for a go file for ever, holding a torch interpreter's memory (seen: ranks
    # left running after their test). The group's pid, as the parent may be gone before we look.
    parent = os.getppid()

    def wanted() -> bool:
        return os.getppid() == parent and (group_pid is None or _alive(group_pid))

    idle = _idle_priority()
    _preimport(entrypoint)
    go.with_name(f"{go.name}.ready-{os.environ.get('RANK', '0')}").touch()
    env = wait_go(go, alive=wanted)
    if env is None:
        sys.exit(1)
    if idle:
        _normal_priority()
    own = {k: os.environ[k] for k in PER_RANK if k in os.environ}
    own.update(regrouped(go, os.environ))  # a spare's slot is known only now
    os.environ.clear()
    os.environ.update(env)
    os.environ.update(own)
    if entrypoint[1] == "-m":
        sys.argv = [entrypoint[2], *entrypoint[3:]]
        runpy.run_module(entrypoint[2], run_name="__main__", alter_sys=True)
    else:
        script = os.path.abspath(entrypoint[1])
        sys.argv = [entrypoint[1], *entrypoint[2:]]
        sys.path[0] = os.path.dirname(script)
        runpy.run_path(script, run_name="__main__")


# --- the group (torchrun's part) ----------------------------------------------------------------


def run_group(go: Path, procs: int, node_rank: int, nnodes: int, entrypoint: list[str]) -> int:
    children = []
    for local in range(procs):
        env = dict(os.environ)
        env.update(rank_env(local, procs, node_rank, nnodes))
        rank_argv = [sys.executable, "-m", "agent.warm", "rank", "--go", str(go), "--group-pid", str(os.getpid())]
        rank_argv += ["--", *entrypoint]
        argv = [sys.executable, "-m", "agent.rank", "--go", str(go), "--", *rank_argv]
        children.append(subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL))

    def stop(signum, _frame) -> None:
        for child in children:
            if child.poll() is None:
                child.send_signal(signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    # Like torchrun: the first rank to fail ends the others, and its code is the group's.
    failed: int | None = None
    while any(c.poll() is None for c in children):
        if failed is None:
            failed = next((c.returncode for c in children if c.returncode not in (None, 0)), None)
            if failed is not None:
                stop(signal.SIGTERM, None)
                deadline = time.time() + TERM_GRACE_S
        elif time.time() > deadline:
            for child in children:
                if child.poll() is None:
                    child.kill()
        time.sleep(0.1)
    if failed is None:
        failed = next((c.returncode for c in children if c.returncode != 0), 0)
    return 1 if failed and failed < 0 else failed


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    head, entrypoint = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    parser = argparse.ArgumentParser(
        prog="python -m agent.warm",
        description=__doc__.split("\n")[0],
        usage="%(prog)s group|rank --go FILE ... -- ENTRYPOINT",
    )
    parser.add_argument("role", choices=["group", "rank"])
    parser.add_argument("--go", required=True, type=Path, help="the go file the agent writes")
    parser.add_argument("--procs", type=int, default=1)
    parser.add_argument("--node-rank", type=int, default=0)
    parser.add_argument("--nnodes", type=int, default=1)
    parser.add_argument(
        "--group-pid", type=int, help="rank: the group it belongs to (it stops waiting when that is gone)"
    )
    args = parser.parse_args(head)
    if not warmable(entrypoint):
        parser.error(f"not a warmable entrypoint: {entrypoint}")
    if args.role == "rank":
        run_rank(args.go, entrypoint, args.group_pid)
        return 0
    return run_group(args.go, args.procs, args.node_rank, args.nnodes, entrypoint)


if __name__ == "__main__":
    sys.exit(main())
