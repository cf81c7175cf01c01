"""Run one rank's command and record how it ended.

torchrun reports only "1" when a rank fails; this wrapper (torch-free, one per rank) records the
real process's pid (the probes and fault injection need it) and its exit code or signal, forwards
SIGTERM/SIGINT, and prefixes every output line with the host and rank so node logs stay readable.

    python -m agent.rank -- python train.py --lr 3e-4
    python -m agent.rank --go FILE -- ...   (a warm rank: agent.warm; nothing is recorded until FILE exists)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from aerie_contracts import env
from agent import inproc
from agent.identity import IdentityError, ml_root, node_dir, resolve_identity
from agent.logparse import LogParser, SegmentSplitter


def main(argv: list[str]) -> int:
    go = None
    if argv[:1] == ["--go"] and len(argv) >= 2:
        go, argv = Path(argv[1]), argv[2:]
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        print("usage: python -m agent.rank -- COMMAND [ARGS...]", file=sys.stderr)
        return 2
    rank = int(os.environ.get("RANK", "0"))
    # The agent exports both; run alone (no agent), they come from the same place the agent reads.
    host = os.environ.get("SM_CURRENT_HOST") or _current_host()
    ranks_dir = node_dir() / "ranks"
    ranks_dir.mkdir(parents=True, exist_ok=True)
    if argv[0] in ("python", "python3"):
        argv = [sys.executable, *argv[1:]]

    try:
        child = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=inproc.child_env(os.environ),  # the in-process probe (agent/inproc), unless health.probe is off
        )
    except OSError as exc:
        print(f"[{host} rank {rank}] cannot start {argv[0]!r}: {exc.strerror}", flush=True)
        _write(ranks_dir / f"rank-{rank}.exit.json", {"rank": rank, "exit_code": 127, "signal": None, "t": time.time()})
        return 127
    if go is not None:
        # A warm rank belongs to the group the go file starts: until then it leaves no trace in
        # the ranks' directory (the agent clears it between groups), and dies silently if unused.
        from agent.warm import regrouped, wait_go

        if wait_go(go, alive=lambda: child.poll() is None) is None:
            return child.wait()
        rank = int(regrouped(go, os.environ).get("RANK", rank))  # a hot spare's group learns its slot now
    _write(ranks_dir / f"rank-{rank}.pid", child.pid)

    def forward(signum, _frame):
        try:
            child.send_signal(signum)
        except ProcessLookupError:
            pass

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)

    assert child.stdout is not None
    _pump(child.stdout.fileno(), f"[{host} rank {rank}] ".encode(), _log_metrics(rank))
    code = child.wait()
    sig = -code if code < 0 else None
    _write(
        ranks_dir / f"rank-{rank}.exit.json",
        {"rank": rank, "exit_code": 128 + sig if sig else code, "signal": sig, "t": time.time()},
    )
    if sig:
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    return code


class _MetricsSink:
    """Log-derived records appended to this rank's metrics stream (`rank-<R>.jsonl`)."""

    def __init__(self, parser: LogParser, path: Path):
        self.parser, self.path, self.splitter = parser, path, SegmentSplitter()

    def push(self, data: bytes) -> None:
        records = [r for seg in self.splitter.push(data) for r in self.parser.feed(seg)]
        if not records:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a") as f:
                f.write("".join(json.dumps(r) + "\n" for r in records))
        except OSError:
            pass  # progress is lost for this line; the rank's output is not


def _log_metrics(rank: int) -> _MetricsSink | None:
    parser = LogParser.from_env(env.LOG_METRICS.get(), rank)
    if parser is None:
        return None
    metrics_dir = Path(env.METRICS_PATH.get() or ml_root() / "output" / "metrics")
    return _MetricsSink(parser, metrics_dir / f"rank-{rank:05d}.jsonl")


def _pump(fd: int, prefix: bytes, sink: _MetricsSink | None) -> None:
    """Copy the child's output to ours, each line prefixed, and hand every chunk to the parser
    as it arrives (a progress bar redraws with '\\r' and may end its line only when done).

    A full line goes out at once. A line not ended yet (a bar's '\\r' redraws) goes out as its
    newest frame, one frame at most every `PARTIAL_EVERY_S`, and when the child goes quiet (a
    hung rank's last bar is in the node log, not held back until a '\\n' that never comes)."""
    import select

    out = sys.stdout.buffer
    pending = b""
    partial = _PartialFrames(prefix)
    while True:
        if pending:
            ready, _, _ = select.select([fd], [], [], partial.wait_s(pending, time.monotonic()))
            if not ready:
                partial.write(out, pending, time.monotonic())
                continue
        data = os.read(fd, 65536)
        if not data:
            break
        if sink is not None:
            sink.push(data)
        pending += data
        *lines, pending = pending.split(b"\n")
        if len(pending) > 1 << 20:
            lines.append(pending)
            pending = b""
        if lines:
            if partial.already_written(lines[0]):
                lines = lines[1:]  # a quiet line's only frame went out already: not twice
            if lines:
                out.write(b"".join(prefix + line + b"\n" for line in lines))
                out.flush()
            partial.line_ended()
        now = time.monotonic()
        partial.pending_since(pending, now)
        if pending:
            partial.write(out, pending, now)
    if pending and not partial.already_written(pending):
        out.write(prefix + pending + b"\n")
        out.flush()


PARTIAL_EVERY_S = 1.0  # at most one partial frame a second per rank goes to the node log
PARTIAL_AFTER_S = 0.5  # a line not ended this long is a bar (or a hung rank's last words), not a print in pieces


class _PartialFrames:
    """The newest frame of a line not ended yet (after its last '\\r'), written as a line of its
    own: only once the line has stayed unended `after_s` (a `print` often writes its text and its
    newline separately: forwarding the text at once wrote every such line twice), then at most
    one frame every `every_s`, never the same frame twice, and not held back once the child is
    quiet."""

    def __init__(self, prefix: bytes, every_s: float = PARTIAL_EVERY_S, after_s: float = PARTIAL_AFTER_S):
        self.prefix, self.every_s, self.after_s = prefix, every_s, after_s
        self.last_t = float("-inf")
        self.last: bytes | None = None  # the frame written last
        self.since: float | None = None  # when the line not ended yet began

    @staticmethod
    def newest(pending: bytes) -> bytes:
        for frame in reversed(pending.split(b"\r")):
            if frame.strip():
                return frame.rstrip()
        return b""

    def pending_since(self, pending: bytes, now: float) -> None:
        if not pending:
            self.since = None
        elif self.since is None:
            self.since = now

    def _due(self) -> float:
        return max(self.last_t + self.every_s, (self.since if self.since is not None else 0.0) + self.after_s)

    def wait_s(self, pending: bytes, now: float) -> float | None:
        """How long the pump may block before the newest frame is due (None: nothing new to write)."""
        frame = self.newest(pending)
        if not frame or frame == self.last:
            return None
        return max(0.0, self._due() - now)

    def write(self, out, pending: bytes, now: float) -> None:
        if now < self._due():
            return
        frame = self.newest(pending)
        if not frame or frame == self.last:
            return
        out.write(self.prefix + frame + b"\n")
        out.flush()
        self.last, self.last_t = frame, now

    def already_written(self, line: bytes) -> bool:
        """Whether `line`, now ended, is one frame that went out already as it stood."""
        return self.last is not None and b"\r" not in line and line.rstrip() == self.last

    def line_ended(self) -> None:
        self.last = None  # a new line's frames are new even where they read the same
        self.since = None


def _current_host() -> str:
    try:
        return resolve_identity().current_host
    except IdentityError:
        return "localhost"


def _write(path: Path, data: object) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
