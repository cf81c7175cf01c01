"""Warm worker groups (agent/warm.py), with real processes: the ranks start, import torch and wait,
leaving no trace until the go file names their group's environment; then they run the entrypoint
with it, under the usual rank wrapper (pid and exit files, prefixed output). A failing rank ends
the group with its code; a group killed unused leaves nothing behind."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from agent.warm import WarmGroup, warmable
from tests.helpers.wait import wait_for

REPO = Path(__file__).resolve().parents[2]

SCRIPT = """
import json, os, sys
out = os.path.join(os.environ["OUT_DIR"], "rank-" + os.environ["RANK"] + ".json")
json.dump({k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_PORT", "WHICH")}
          | {"argv": sys.argv, "torch": "torch" in sys.modules, "policy": os.sched_getscheduler(0)}, open(out, "w"))
print("hello from", os.environ["RANK"])
sys.exit(int(os.environ.get("FAIL_RANK", "-1") == os.environ["RANK"]) * 3)
"""

# A ceiling, not a speed: a warm rank imports torch on idle CPU time only (SCHED_IDLE), and on a
# host whose cores are all busy (CI: two xdist workers and their jobs) that took over 60 s.
WARM_S = 240


def test_warmable_entrypoints():
    assert warmable(["python", "-m", "trainer.train", "--config", "x.yaml"])
    assert warmable(["python3", "train.py", "--lr", "3e-4"])
    assert warmable([sys.executable, "train.py"])
    assert not warmable(["python", "-c", "print(1)"])
    assert not warmable(["bash", "run.sh"])
    assert not warmable(["python", "-m"])


@pytest.fixture
def group(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    node_dir = tmp_path / "agent"
    (node_dir / "ranks").mkdir(parents=True)
    out = tmp_path / "out"
    out.mkdir()
    warm = WarmGroup(node_dir, tmp_path, ["python", str(script), "--flag"], procs=2, node_rank=1, nnodes=2)
    env = {**os.environ, "AERIE_NODE_DIR": str(node_dir), "OUT_DIR": str(out), "PYTHONPATH": str(REPO)}
    yield warm, env, node_dir, out
    warm.discard()


def test_ranks_wait_for_the_go_file_then_run_with_its_environment(group):
    warm, env, node_dir, out = group
    warm.start({**env, "WHICH": "warm-up"})
    time.sleep(2.0)  # long enough to import torch here, and to have run, had it not waited
    assert not list((node_dir / "ranks").iterdir()) and not list(out.iterdir())
    proc = warm.take({**env, "WHICH": "the group's"}, "127.0.0.1", 29123)
    assert proc is not None
    assert proc.wait(timeout=60) == 0
    ranks = {p.name: json.loads(p.read_text()) for p in out.iterdir()}
    assert set(ranks) == {"rank-2.json", "rank-3.json"}
    for name, rank in ranks.items():
        assert rank["RANK"] == name[5] and rank["WORLD_SIZE"] == "4" and rank["MASTER_PORT"] == "29123"
        assert rank["WHICH"] == "the group's" and rank["torch"] is True
        assert rank["policy"] == os.SCHED_OTHER  # warmed up on idle time, run at the usual priority
        assert rank["argv"][1:] == ["--flag"]
    exits = [json.loads(p.read_text()) for p in (node_dir / "ranks").glob("rank-*.exit.json")]
    assert sorted(e["rank"] for e in exits) == [2, 3] and all(e["exit_code"] == 0 for e in exits)
    assert len(list((node_dir / "ranks").glob("rank-*.pid"))) == 2


def test_a_failing_rank_ends_the_group_with_its_code(group):
    warm, env, node_dir, _out = group
    warm.start(env)
    proc = warm.take({**env, "FAIL_RANK": "3"}, "127.0.0.1", 29124)
    assert proc is not None and proc.wait(timeout=60) == 3
    failed = json.loads((node_dir / "ranks" / "rank-3.exit.json").read_text())
    assert failed["exit_code"] == 3


def test_an_unused_group_is_killed_with_its_ranks(group):
    warm, env, node_dir, _out = group
    warm.start(env)
    pid = warm.proc.pid
    wait_for(what="the ranks", check=lambda: len(_children(pid)) >= 2, timeout_s=30)
    ranks = _children(pid)
    warm.discard()
    wait_for(what="every rank gone", check=lambda: not any(_alive(p) for p in [pid, *ranks]), timeout_s=20)
    assert not list((node_dir / "ranks").iterdir())
    assert warm.take(env, "127.0.0.1", 1) is None


def test_waiting_ranks_warm_up_on_idle_cpu_time_only(group):
    """SCHED_IDLE while they import and wait (they must not slow the group that trains beside
    them); the test above shows the entrypoint itself runs at the usual priority."""
    warm, env, node_dir, _out = group
    warm.start(env)
    pid = warm.proc.pid
    ready = lambda: len(list(node_dir.glob("warm-go.json.ready-*"))) == 2  # noqa: E731
    wait_for(what="both ranks warm", check=ready, timeout_s=WARM_S)
    policies = [os.sched_getscheduler(p) for p in _warm_ranks(pid)]
    assert len(policies) == 2, policies
    # Root (as here and in containers) may always switch back, so it always warms up idle; anyone
    # else only where RLIMIT_NICE lets it switch back (else at the usual priority).
    if os.geteuid() == 0:
        assert policies == [os.SCHED_IDLE] * 2, policies
    assert os.sched_getscheduler(pid) == os.SCHED_OTHER  # the group itself (torchrun's part) is not


def _warm_ranks(pid: int) -> list[int]:
    import psutil

    found = []
    for p in _children(pid):
        try:
            argv = psutil.Process(p).cmdline()
            if argv[1:4] == ["-m", "agent.warm", "rank"]:  # not the agent.rank wrappers around them
                found.append(p)
        except psutil.NoSuchProcess:
            pass
    return found


def _children(pid: int) -> list[int]:
    import psutil

    try:
        return [c.pid for c in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_go_file_s_group_places_a_rank_warmed_before_its_slot_was_known(tmp_path):
    from agent.warm import rank_env, regrouped, write_go

    go = tmp_path / "warm-go.json"
    write_go(go, {"A": "1"})
    assert regrouped(go, {"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}) == {}  # no group: as spawned
    # A hot spare's group warmed as node 0 of 1; the go file puts it in slot 1 of 2.
    write_go(go, {"A": "1"}, {"node_rank": 1, "nnodes": 2})
    env = regrouped(go, {"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"})
    assert env == rank_env(1, 2, 1, 2)
    assert (env["RANK"], env["WORLD_SIZE"], env["GROUP_RANK"], env["LOCAL_RANK"]) == ("3", "4", "1", "1")


def test_a_waiting_rank_whose_parent_is_killed_exits_on_its_own(tmp_path):
    """The rank wrapper above a waiting rank SIGKILLed (nothing forwards a signal): the rank,
    reparented, stops waiting for its go file instead of holding a warm interpreter for ever."""
    import signal
    import subprocess

    import psutil

    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    go = tmp_path / "warm-go.json"
    rank = [sys.executable, "-m", "agent.warm", "rank", "--go", str(go), "--", "python", str(script)]
    # A stand-in parent that starts the rank and then only sleeps, as the rank wrapper waits on it.
    parent_code = f"import subprocess, sys, time; subprocess.Popen({rank!r}); time.sleep(600)"
    env = {**os.environ, "PYTHONPATH": str(REPO), "RANK": "0"}
    parent = subprocess.Popen([sys.executable, "-c", parent_code], env=env, start_new_session=True)
    child: list[int] = []
    try:
        wait_for(what="the rank warm", check=lambda: (tmp_path / "warm-go.json.ready-0").exists(), timeout_s=WARM_S)
        child = _children(parent.pid)
        assert len(child) == 1, child
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(timeout=10)
        wait_for(what="the orphaned rank gone", check=lambda: not _alive(child[0]), timeout_s=20)
        assert not go.exists()  # it left on its own: no go file ever came
    finally:
        for pid in child:  # the parent is gone by now: its children are not found through it
            if _alive(pid):
                psutil.Process(pid).kill()
        if parent.poll() is None:
            parent.kill()


def test_a_waiting_rank_whose_group_is_gone_exits_on_its_own(tmp_path):
    """The group discarded while this rank was still starting (so its kill did not find the rank,
    and the rank's own parent may be gone before it looks): the rank stops waiting once its group's
    pid (`--group-pid`) is gone."""
    import subprocess

    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    go = tmp_path / "warm-go.json"
    group = subprocess.Popen(["sleep", "600"])  # stands in for the group's pid
    argv = [sys.executable, "-m", "agent.warm", "rank", "--go", str(go), "--group-pid", str(group.pid)]
    rank = subprocess.Popen([*argv, "--", "python", str(script)], env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        wait_for(what="the rank warm", check=lambda: (tmp_path / "warm-go.json.ready-0").exists(), timeout_s=WARM_S)
        assert rank.poll() is None  # its group lives: it waits
        group.kill()
        group.wait(timeout=10)
        assert rank.wait(timeout=20) == 1 and not go.exists()
    finally:
        for proc in (rank, group):
            if proc.poll() is None:
                proc.kill()
