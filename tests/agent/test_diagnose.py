"""Stop-time diagnosis (`agent/diagnose.py`) on real processes: a rank whose probe registered the
stack signal answers with its stacks and state; a stopped rank is reported stopped, from its state
file, and never resumed (it would run on): its stack is read from its memory by the real py-spy;
a rank without the probe is never sent a signal that would kill it (py-spy reads its stack too)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil

import agent.diagnose as diagnosis
from agent.diagnose import diagnose, faulthandler_text
from recovery.hang_root import find_root_cause, main_thread_frames, rank_view

REPO = Path(__file__).resolve().parents[2]

WITH_PROBE = textwrap.dedent(
    """
    import sys, time
    from agent.inproc.sink import Sink

    sink = Sink()
    sink.claim(int(sys.argv[1]))
    sink.state(collectives=7, inside=sys.argv[2] or None, step=41)
    print("ready", flush=True)

    def stuck_in_my_loop():
        while True:
            time.sleep(0.01)

    stuck_in_my_loop()
    """
)
WITHOUT_PROBE = "import time\nprint('ready', flush=True)\nwhile True: time.sleep(0.01)\n"


def _start(tmp_path: Path, code: str, *args: str) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "AERIE_NODE_DIR": str(tmp_path / "agent"),
        "AERIE_METRICS_PATH": str(tmp_path / "metrics"),
    }
    proc = subprocess.Popen([sys.executable, "-c", code, *args], env=env, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def test_ranks_answer_with_stacks_and_state_and_a_stopped_or_unprobed_rank_is_left_alone(tmp_path):
    ranks = tmp_path / "agent" / "ranks"
    procs = [
        _start(tmp_path, WITH_PROBE, "0", ""),
        _start(tmp_path, WITH_PROBE, "1", "all_reduce"),
        _start(tmp_path, WITHOUT_PROBE),
    ]
    try:
        for rank, proc in enumerate(procs):
            (ranks / f"rank-{rank}.pid").write_text(str(proc.pid))
        os.kill(procs[1].pid, signal.SIGSTOP)
        time.sleep(0.2)
        found = diagnose(ranks)
        assert set(found) == {"0", "1", "2"}
        assert found["0"]["answered"] and "stuck_in_my_loop" in found["0"]["stack"], found["0"]
        assert (found["0"]["collectives"], found["0"]["in_collective"], found["0"]["step"]) == (7, None, 41)
        assert found["1"]["process_state"] == "stopped", found["1"]
        assert not found["1"]["answered"], found["1"]  # never resumed to dump
        # Its stack all the same, read by py-spy from its memory: where it was stopped.
        assert found["1"]["stack_by"] == "py-spy" and "stuck_in_my_loop" in found["1"]["stack"], found["1"]
        assert psutil.Process(procs[1].pid).status() == "stopped"  # still
        assert found["1"]["in_collective"] == "all_reduce"  # read from its state file while stopped
        assert found["2"].get("collectives") is None
        # No probe: its stack read by py-spy, which tells where it is as a dump would.
        assert found["2"]["answered"] and found["2"]["stack_by"] == "py-spy" and "<module>" in found["2"]["stack"]
        # The control plane's reading: the stopped rank is the cause, named with its frame.
        views = [rank_view("algo-1", r, found[r]) for r in ("0", "1")]
        assert views[1].stopped and views[1].frame and "stuck_in_my_loop()" in views[1].frame, views[1]
        time.sleep(0.3)
        assert all(p.poll() is None for p in procs), [p.poll() for p in procs]  # nobody was killed
        # A second diagnosis reads only the new dump.
        again = diagnose(ranks)
        assert again["0"]["stack"].count("Current thread") == 1
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def test_nothing_to_diagnose_without_ranks(tmp_path):
    assert diagnose(tmp_path) == {}


def test_without_py_spy_a_stopped_rank_is_reported_without_a_stack(tmp_path, monkeypatch):
    monkeypatch.setattr(diagnosis, "spy_command", lambda: None)
    ranks = tmp_path / "agent" / "ranks"
    proc = _start(tmp_path, WITH_PROBE, "0", "")
    try:
        (ranks / "rank-0.pid").write_text(str(proc.pid))
        os.kill(proc.pid, signal.SIGSTOP)
        time.sleep(0.2)
        found = diagnose(ranks)
        assert found["0"]["process_state"] == "stopped" and "stack" not in found["0"], found
        assert psutil.Process(proc.pid).status() == "stopped"
    finally:
        proc.kill()
        proc.wait()


def test_a_py_spy_dump_reads_as_a_faulthandler_dump_of_the_main_thread():
    dump = [
        {
            "os_thread_id": 11,
            "thread_id": 1,
            "thread_name": "worker",
            "frames": [{"name": "side", "filename": "/w.py", "line": 3}],
        },
        {
            "os_thread_id": 10,
            "thread_id": 140535891852160,
            "thread_name": "MainThread",
            "frames": [
                {"name": "Loader.next", "filename": "/job/data/loader.py", "line": 88},
                {"name": "<module>", "filename": "/job/train.py", "line": 5},
            ],
        },
    ]
    import json

    text = faulthandler_text(json.dumps(dump), pid=10)
    assert main_thread_frames(text) == [("/job/data/loader.py", 88, "next"), ("/job/train.py", 5, "<module>")]
    assert faulthandler_text("not json", 10) == faulthandler_text("[]", 10) == ""
    stopped = rank_view("algo-2", "3", {"process_state": "stopped", "answered": False, "stack": text})
    waiting = rank_view(
        "algo-1",
        "0",
        {
            "process_state": "sleeping",
            "answered": True,
            "in_collective": "all_reduce",
            "stack": 'Current thread 0x1 (most recent call first):\n  File "/t.py", line 1 in f\n',
        },
    )
    cause = find_root_cause([stopped, waiting])
    assert cause is not None and "rank 3 on algo-2 in data/loader.py:88 next()" in cause.message, cause
