"""agent/rank.py forwards a line that never ends (a progress bar's '\\r' redraws) to the node log:
its newest frame, at most one a second, and at once when the rank goes quiet (a hung rank's last
bar is in node.log); full lines still go out whole and at once, prefixed with host and rank."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CHILD = r"""
import sys, time
print("starting", flush=True)
for i in range(1, 41):  # 40 frames in 0.4 s, then one more, then silence (a hung rank)
    sys.stdout.write(f"\rEpoch 0:  {i}%|#  | {i}/100 [00:01<00:10]")
    sys.stdout.flush()
    time.sleep(0.01)
sys.stdout.write("\rEpoch 0:  41%|#  | 41/100 [00:01<00:10, stuck]")
sys.stdout.flush()
time.sleep(60)
"""


def test_a_hung_ranks_last_bar_frame_reaches_the_node_log(tmp_path):
    env = {**os.environ, "AERIE_ML_ROOT": str(tmp_path), "RANK": "0", "PYTHONUNBUFFERED": "1"}
    env.pop("AERIE_LOG_METRICS", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "agent.rank", "--", sys.executable, "-c", CHILD],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    lines: list[tuple[float, bytes]] = []

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append((time.monotonic(), line))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 60
        started = None
        while time.monotonic() < deadline:
            if started is None and any(b"starting" in ln for _, ln in lines):
                started = next(t for t, ln in lines if b"starting" in ln)
            if any(b"stuck" in ln for _, ln in lines):
                break
            time.sleep(0.05)
        assert started is not None, lines
        stuck = [(t, ln) for t, ln in lines if b"stuck" in ln]
        assert stuck, lines
        # the frames took ~0.4 s after "starting"; the last one is out within ~1-2 s of it
        assert stuck[0][0] - started < 3.0, (stuck[0][0] - started, lines)
        line = stuck[0][1]
        assert line.startswith(b"[") and b" rank 0] Epoch 0:  41%" in line and line.endswith(b"stuck]\n")
        assert b"\r" not in line  # the newest frame alone
        frames = [ln for _, ln in lines if b"Epoch 0:" in ln]
        assert len(frames) <= 4, frames  # 41 redraws, rate-limited to about one a second
        time.sleep(1.5)
        assert len([ln for _, ln in lines if b"stuck" in ln]) == 1  # the same frame is not repeated
        assert lines[0][1].endswith(b"] starting\n")  # a full line: at once, whole, prefixed
    finally:
        proc.send_signal(signal.SIGTERM)  # forwarded to the child
        proc.wait(30)


class _Out:
    def __init__(self) -> None:
        self.lines: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.lines += data.splitlines()

    def flush(self) -> None:
        pass


def test_a_print_in_two_writes_is_one_line_and_a_bar_waits_its_turn():
    """On an injected clock: a line's text whose newline follows at once is never forwarded as a
    partial frame (a `print` writing text and newline apart had every such line logged twice); a
    line unended past `after_s` is, once, and its ending does not write it again."""
    from agent.rank import _PartialFrames

    out, pf = _Out(), _PartialFrames(b"[r0] ", every_s=1.0, after_s=0.5)
    pf.pending_since(b"contract ok=True", 10.0)
    assert pf.wait_s(b"contract ok=True", 10.0) == 0.5
    pf.write(out, b"contract ok=True", 10.0)
    pf.write(out, b"contract ok=True", 10.3)
    assert out.lines == [] and not pf.already_written(b"contract ok=True")  # its "\n" came: written whole
    pf.line_ended()

    pf.pending_since(b"waiting for the barrier", 20.0)
    pf.write(out, b"waiting for the barrier", 20.6)  # quiet for 0.6 s: its last words go out
    assert out.lines == [b"[r0] waiting for the barrier"]
    assert pf.already_written(b"waiting for the barrier")  # ... and not again when it ends
    pf.line_ended()

    bar = b""
    for i in range(30):  # 3 s of redraws, ten a second
        now = 30.0 + i / 10
        bar += b"\r %d/100" % i
        pf.pending_since(bar, now)
        pf.write(out, bar, now)
    frames = out.lines[1:]
    assert frames == [b"[r0]  5/100", b"[r0]  15/100", b"[r0]  25/100"], frames  # from 0.5 s, one a second
    assert not pf.already_written(bar)  # its "\n" writes the whole bar line
