"""Stop-time diagnosis: what each of this node's ranks was doing when the agent called a hang.

Before the agent stops a hung attempt (`silent.hang`, `checkpoint.stalled`) it asks each rank for
its Python stacks, by the in-process probe's signal (`aerie_contracts.probe.stack_signal`:
`faulthandler` writes every thread's stack without running Python code, so a rank stuck in a C
call or a tight loop still answers), and reads each rank's state file (its collective count and
the collective it is inside, kept current by the probe, readable even from a stopped rank). The
result goes into the verdict's evidence as `ranks`; the control plane reads it from every node and
names the rank the others wait for (recovery/hang_root.py).

A rank is signalled only when its probe registered the handler (its stacks file exists and its
state file names the rank's pid): the signal's default action would kill a rank without it. A
stopped rank (SIGSTOP) is reported as stopped, which is the finding, with what its state file
says; it is never resumed for a dump (resumed, even for the moment a dump takes, a rank ran on:
a tiny trainer's stopped rank finished a step and a memory snapshot before it was stopped again,
and that snapshot became the resume point). A rank stopped by a tracer (a debugger) or a zombie
is left as it is too.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

from aerie_contracts import probe as contract
from aerie_contracts.states import STOPPED_PROCESS_STATES, ProcessState

ANSWER_WAIT_S = 1.5  # how long the ranks have to write their stacks (the verdict waits on it)
SPY_WAIT_S = 5.0  # py-spy reads a stopped rank's memory in ~0.2 s; all ranks at once, bounded
SPY_MAX_FRAMES = 50  # innermost first: the frames that say where it is (faulthandler's cap is 100)
MAX_STACK_CHARS = 6000  # per rank, the dump's end (the main thread is last): evidence stays small
_STABLE_S = 0.1


def diagnose(ranks_dir: Path, answer_wait_s: float = ANSWER_WAIT_S) -> dict[str, dict[str, Any]]:
    """{rank: {pid, process_state, answered, collectives, in_collective, step, stack}} for every
    rank of this node that has a pid file; empty when the probe is off or the ranks are gone."""
    signum = contract.stack_signal()
    found: dict[str, dict[str, Any]] = {}
    asked: dict[str, tuple[Path, int]] = {}
    spied: dict[str, tuple[int, subprocess.Popen[bytes]]] = {}
    for pid_file in sorted(ranks_dir.glob("rank-*.pid")):
        rank = pid_file.name[len("rank-") : -len(".pid")]
        pid = _read_int(pid_file)
        if pid is None:
            continue
        state = _state(ranks_dir / contract.STATE_FILE.format(rank=rank))
        seen: dict[str, Any] = {"pid": pid, "process_state": _process_state(pid), "answered": False}
        seen.update(
            {k: state.get(k) for k in (contract.STATE_COLLECTIVES, contract.STATE_IN_COLLECTIVE, contract.STATE_STEP)}
        )
        found[rank] = seen
        stacks = ranks_dir / contract.STACKS_FILE.format(rank=rank)
        registered = stacks.exists() and state.get(contract.STATE_PID) == pid
        stopped = seen["process_state"] == ProcessState.STOPPED
        if stopped or (seen["process_state"] not in STOPPED_PROCESS_STATES and (signum is None or not registered)):
            spy = _start_spy(pid)  # read from its memory: never resumed, never signalled
            if spy is not None:
                spied[rank] = (pid, spy)
            continue
        if seen["process_state"] in STOPPED_PROCESS_STATES:
            continue
        size = stacks.stat().st_size
        try:
            os.kill(pid, signum)
        except OSError:
            continue
        asked[rank] = (stacks, size)
    deadline = time.monotonic() + answer_wait_s
    waiting = dict(asked)
    while waiting and time.monotonic() < deadline:
        time.sleep(_STABLE_S)
        for rank, (path, size) in list(waiting.items()):
            if _grown_and_still(path, size):
                del waiting[rank]
    for rank, (path, size) in asked.items():
        text = _read_from(path, size)
        if "Current thread" in text:
            found[rank].update(answered=True, stack=text[-MAX_STACK_CHARS:])
    spy_deadline = time.monotonic() + SPY_WAIT_S
    for rank, (pid, spy) in spied.items():
        text = _spy_result(spy, pid, max(0.0, spy_deadline - time.monotonic()))
        if text:
            # A running rank read by py-spy (no probe) says where it is as a dump would; a stopped
            # one has not answered, and that is the finding.
            answered = found[rank]["process_state"] != ProcessState.STOPPED
            found[rank].update(stack=text[-MAX_STACK_CHARS:], stack_by=SPY, answered=answered)
    return found


SPY = "py-spy"


def spy_command() -> str | None:
    """py-spy beside this interpreter (the agent's environment), else on PATH; None without it."""
    beside = Path(sys.executable).with_name(SPY)
    return str(beside) if beside.is_file() else shutil.which(SPY)


def _start_spy(pid: int) -> subprocess.Popen[bytes] | None:
    command = spy_command()
    if command is None:
        return None
    try:
        return subprocess.Popen(
            [command, "dump", "--pid", str(pid), "--nonblocking", "--full-filenames", "--json"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL,
        )
    except OSError:
        return None


def _spy_result(spy: subprocess.Popen[bytes], pid: int, wait_s: float) -> str:
    """The main thread's stack from `py-spy dump --json`, written as `faulthandler` writes it (what
    recovery/hang_root.py reads); "" when py-spy could not read the process."""
    try:
        out, _ = spy.communicate(timeout=wait_s)
    except subprocess.TimeoutExpired:
        spy.kill()
        spy.communicate()
        return ""
    return faulthandler_text(out, pid)


def faulthandler_text(spy_json: bytes | str, pid: int) -> str:
    """py-spy's JSON dump (a list of threads) as a `faulthandler` dump of the main thread (the
    thread whose OS id is the pid), innermost frame first; "" if it holds none."""
    try:
        threads = json.loads(spy_json or "[]")
    except ValueError:
        return ""
    if not isinstance(threads, list):
        return ""
    main = next((t for t in threads if isinstance(t, dict) and t.get("os_thread_id") == pid), None)
    if main is None:
        main = next((t for t in threads if isinstance(t, dict) and t.get("thread_name") == "MainThread"), None)
    if main is None:
        return ""
    lines = [f"Current thread {int(main.get('thread_id') or 0):#018x} (most recent call first):"]
    for f in (main.get("frames") or [])[:SPY_MAX_FRAMES]:
        if isinstance(f, dict):
            name = str(f.get("name") or "?").rsplit(".", 1)[-1]  # faulthandler writes the bare name
            lines.append(f'  File "{f.get("filename")}", line {f.get("line")} in {name}')
    return "\n".join(lines) + "\n"


def _grown_and_still(path: Path, size: int) -> bool:
    try:
        first = path.stat().st_size
        if first <= size:
            return False
        time.sleep(_STABLE_S / 2)
        return path.stat().st_size == first
    except OSError:
        return False


def _read_from(path: Path, offset: int) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def _state(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_bytes().decode("utf-8", "replace").strip() or "{}")
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _process_state(pid: int) -> str:
    try:
        return str(psutil.Process(pid).status())
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return ProcessState.GONE.value
    except psutil.Error:
        return "unknown"
