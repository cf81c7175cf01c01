"""The Monitor end to end: real fake-rank processes, real probes, real metrics files."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent.monitor import Monitor

FAKE_RANK = Path(__file__).with_name("fake_rank.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def node(tmp_path):
    """A node dir laid out like AERIE_ML_ROOT, and a launcher for fake ranks."""
    root = tmp_path / "ml"
    (root / "agent" / "ranks").mkdir(parents=True)
    (root / "output" / "metrics").mkdir(parents=True)
    procs: list[subprocess.Popen] = []
    port = free_port()

    def launch(world: int = 2, extra: dict[int, list[str]] | None = None) -> list[subprocess.Popen]:
        for r in range(world):
            procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        str(FAKE_RANK),
                        "--rank",
                        str(r),
                        "--world",
                        str(world),
                        "--metrics",
                        str(root / "output" / "metrics"),
                        "--pid-dir",
                        str(root / "agent" / "ranks"),
                        "--port",
                        str(port),
                        "--bytes",
                        "65536",
                        "--compute-s",
                        "0.05",
                        "--wait-s",
                        "0.05",
                        *(extra or {}).get(r, []),
                    ]
                )
            )
        deadline = time.time() + 20
        while len(list((root / "agent" / "ranks").glob("rank-*.pid"))) < world:
            assert time.time() < deadline, "ranks did not start"
            time.sleep(0.05)
        return procs

    yield root, launch
    for p in procs:
        for sig in (signal.SIGCONT, signal.SIGKILL):
            try:
                p.send_signal(sig)
            except ProcessLookupError:
                pass
        p.wait()


def wait_steps(root: Path, rank: int, n: int, timeout: float = 20) -> None:
    f = root / "output" / "metrics" / f"rank-{rank:05d}.jsonl"
    deadline = time.time() + timeout
    while time.time() < deadline:
        if f.exists() and f.read_text().count("\n") >= n:
            return
        time.sleep(0.05)
    raise AssertionError(f"rank {rank} did not reach {n} steps")


def test_summary_follows_the_heartbeat_contract(node):
    root, launch = node
    launch()
    wait_steps(root, 1, 3)
    mon = Monitor(
        node_dir=root / "agent",
        metrics_dir=root / "output" / "metrics",
        health={},
        host="algo-1",
        interfaces=["lo"],
        accelerator="cpu",
    )
    for _ in range(4):
        assert mon.tick() == []
        time.sleep(0.4)
    s = mon.summary()
    json.dumps(s, allow_nan=False)
    assert {
        "accelerators",
        "nics",
        "last_step",
        "last_step_t",
        "last_loss",
        "step_time_p50",
        "step_time_p95",
        "processes",
        "in_checkpoint",
        "in_eval",
        "rank_steps",
    } <= set(s)
    assert {"0", "1"} <= set(s["rank_steps"]) and all(r["step"] >= 3 for r in s["rank_steps"].values()), s["rank_steps"]
    assert sorted(a["index"] for a in s["accelerators"]) == [0, 1]
    assert all({"index", "util", "mem_used"} <= set(a) for a in s["accelerators"])
    assert s["nics"][0]["name"] == "lo" and s["nics"][0]["rx_bps"] > 0  # the all-reduce crosses lo
    assert s["last_step"] >= 3 and s["last_loss"] > 0 and 0 < s["step_time_p50"] <= s["step_time_p95"]
    assert time.time() - 60 < s["last_step_t"] <= time.time()  # when the slowest rank logged it
    assert [(p["rank"], p["state"] in ("running", "sleeping")) for p in s["processes"]] == [(0, True), (1, True)]
    assert s["in_checkpoint"] is False and s["in_eval"] is False


def test_sigstopped_rank_is_an_idle_hang_within_seconds(node):
    root, launch = node
    launch()
    wait_steps(root, 1, 5)
    health = {"startup_grace_s": 0, "hang_floor_s": 2, "hang_factor": 1, "unknown_key": "ignored"}
    mon = Monitor(
        node_dir=root / "agent",
        metrics_dir=root / "output" / "metrics",
        health=health,
        interfaces=["lo"],
        accelerator="cpu",
        sample_s=0.25,
    )
    mon.tick()
    pid1 = int((root / "agent" / "ranks" / "rank-1.pid").read_text())
    os.kill(pid1, signal.SIGSTOP)
    t0, verdicts = time.time(), []
    while not verdicts and time.time() - t0 < 15:
        time.sleep(0.25)
        verdicts = mon.tick()
    assert [v.kind for v in verdicts] == ["silent.hang"], verdicts
    ev = verdicts[0].evidence
    assert ev["state"] == "idle" and [p["rank"] for p in ev["stopped"]] == [1]
    json.dumps(ev, allow_nan=False)
    assert time.time() - t0 < 8
    assert mon.tick() == []  # reported once
    assert mon.summary()["processes"][1]["state"] == "stopped"


def test_checkpoint_window_shows_in_summary_and_suppresses_hang(tmp_path):
    metrics = tmp_path / "metrics"
    metrics.mkdir()
    now = time.time()
    lines = [
        {"t": now - 100 + i, "rank": 0, "step": i, "loss": 2.0, "step_s": 1.0, "event": None} for i in range(1, 10)
    ]
    lines.append({"t": now - 90, "rank": 0, "step": 9, "event": "checkpoint_begin"})
    (metrics / "rank-00000.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    mon = Monitor(
        node_dir=tmp_path / "agent",
        metrics_dir=metrics,
        health={"startup_grace_s": 0},
        interfaces=["lo"],
        accelerator="cpu",
        started_at=now - 200,
    )
    assert mon.tick() == [] and mon.summary()["in_checkpoint"] is True
    with open(metrics / "rank-00000.jsonl", "a") as f:
        f.write(json.dumps({"t": now - 50, "rank": 0, "step": 9, "event": "checkpoint_end"}) + "\n")
    assert [v.kind for v in mon.tick()] == ["silent.hang"]  # 50 s since the checkpoint ended


def test_interfaces_come_from_resourceconfig(tmp_path):
    (tmp_path / "input" / "config").mkdir(parents=True)
    (tmp_path / "input" / "config" / "resourceconfig.json").write_text(
        json.dumps({"current_host": "algo-1", "hosts": ["algo-1"], "network_interface_name": "lo"})
    )
    mon = Monitor(
        node_dir=tmp_path / "agent", metrics_dir=tmp_path / "output" / "metrics", health={}, accelerator="cpu"
    )
    assert mon.nic.interfaces == ["lo"]
    mon.tick()
    mon.tick()
    assert [n["name"] for n in mon.summary()["nics"]] == ["lo"]
