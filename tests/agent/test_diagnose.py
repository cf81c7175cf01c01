"""Stop-time diagnosis (`agent/diagnose.py`) on real processes: a rank whose probe registered the
stack signal answers with its stacks and state; a stopped rank is reported stopped, from its state
file, and never resumed (it would run on); a rank without the probe is never sent a signal that would kill it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil

from agent.diagnose import diagnose

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
        assert not found["1"]["answered"] and "stack" not in found["1"], found["1"]  # never resumed to dump
        assert psutil.Process(procs[1].pid).status() == "stopped"  # still
        assert found["1"]["in_collective"] == "all_reduce"  # read from its state file while stopped
        assert not found["2"]["answered"] and found["2"].get("collectives") is None
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
