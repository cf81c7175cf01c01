"""The node's process chain: entrypoint (PID-1 role) -> agent -> rank wrapper -> entrypoint command.

Real processes and signals; no control plane (the reporter is disabled without AERIE_API), so the
outcome is read from the files the backends read: agent/exit.json and output/failure.
"""

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

from aerie_contracts.container import NodeContract
from agent.config import rank_command
from tests.helpers.supervisor_parts import agent_config

REPO = Path(__file__).resolve().parents[2]


def _node(
    tmp_path: Path, command: list[str], health: dict | None = None, procs_per_node: int = 1
) -> tuple[NodeContract, dict]:
    contract = NodeContract(
        ml_root=tmp_path / "algo-1", hosts=("algo-1",), current_host="algo-1", hyperparameters={"lr": "0.1"}
    )
    contract.write()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AERIE_", "SM_"))}
    env.update(contract.env())
    env.update(
        {
            "AERIE_ENTRYPOINT": json.dumps(command),
            "AERIE_PROCS_PER_NODE": str(procs_per_node),
            "AERIE_HEALTH": json.dumps(health or {"startup_grace_s": 600}),
            "AERIE_WORKDIR": str(REPO),
        }
    )
    return contract, env


def _start(env: dict) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "agent.entrypoint"],
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_exit_code_and_rank_output_are_preserved(tmp_path):
    contract, env = _node(tmp_path, ["python", "-c", "print('hello from rank'); raise SystemExit(3)"])
    proc = _start(env)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 3
    assert "[algo-1 rank 0] hello from rank" in out
    outcome = json.loads((contract.node_dir / "exit.json").read_text())
    assert outcome["exit_code"] == 3
    assert outcome["reason"]["kind"] == "exit.nonzero" and outcome["reason"]["exit_code"] == 3
    assert "exit.nonzero" in (contract.ml_root / "output" / "failure").read_text()
    rank_exit = json.loads((contract.node_dir / "ranks" / "rank-0.exit.json").read_text())
    assert rank_exit["exit_code"] == 3


def test_success_writes_no_failure_file(tmp_path):
    contract, env = _node(tmp_path, ["python", "-c", "import os; print(os.environ['SM_CURRENT_HOST'])"])
    proc = _start(env)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert "[algo-1 rank 0] algo-1" in out
    assert json.loads((contract.node_dir / "exit.json").read_text())["exit_code"] == 0
    assert not (contract.ml_root / "output" / "failure").exists()


def test_sigterm_to_the_entrypoint_stops_the_whole_tree(tmp_path):
    contract, env = _node(tmp_path, ["python", "-c", "import time; print('up', flush=True); time.sleep(600)"])
    proc = _start(env)
    pid_file = contract.node_dir / "ranks" / "rank-0.pid"
    deadline = time.time() + 30
    while not pid_file.exists():
        assert time.time() < deadline, "the rank never started"
        time.sleep(0.1)
    rank_pid = int(pid_file.read_text())
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=30)
    assert proc.returncode == 143
    outcome = json.loads((contract.node_dir / "exit.json").read_text())
    assert outcome["reason"]["kind"] == "user.stop"
    with pytest.raises(ProcessLookupError):
        os.kill(rank_pid, 0)


def _alive(pid: int) -> bool:
    """Running (a zombie has already died: it only waits for its parent to reap it)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _ignores_sigterm(pid: int) -> bool:
    with open(f"/proc/{pid}/status") as f:
        mask = next(line for line in f if line.startswith("SigIgn:")).split()[1]
    return bool(int(mask, 16) & (1 << (signal.SIGTERM - 1)))


def test_ranks_that_ignore_sigterm_under_torchrun_die_with_the_node(tmp_path):
    """torchrun starts each worker in a session of its own, so killing torchrun's process group
    misses the ranks; a rank that ignores SIGTERM (a busy hang) outlived the node and kept its
    core (or GPU) forever. The agent is a child subreaper and kills the whole tree it started."""
    hung = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(600)"
    )
    contract, env = _node(tmp_path, ["python", "-c", hung], procs_per_node=2)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env.update({"AERIE_MASTER_ADDR": "127.0.0.1", "AERIE_MASTER_PORT": str(port)})
    # Output to a file, not a pipe: a leftover rank would hold a pipe open, and the test would
    # hang on it instead of failing on the assertion below.
    log = open(tmp_path / "node.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "agent.entrypoint"], env=env, cwd=REPO, stdout=log, stderr=log)
    pid_files = [contract.node_dir / "ranks" / f"rank-{r}.pid" for r in (0, 1)]
    deadline = time.time() + 60
    while not all(f.exists() for f in pid_files):
        assert time.time() < deadline, "the ranks never started"
        time.sleep(0.1)
    rank_pids = [int(f.read_text()) for f in pid_files]
    while not all(_ignores_sigterm(pid) for pid in rank_pids):  # the hang has begun
        assert time.time() < deadline, "the ranks never set up their hang"
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)  # the agent waits out its grace, then SIGKILLs
    log.close()
    deadline = time.time() + 10
    while any(_alive(pid) for pid in rank_pids) and time.time() < deadline:
        time.sleep(0.2)
    leftover = [pid for pid in rank_pids if _alive(pid)]
    for pid in leftover:
        os.kill(pid, signal.SIGKILL)
    assert not leftover, "ranks outlived their node"
    assert json.loads((contract.node_dir / "exit.json").read_text())["reason"]["kind"] == "user.stop"


def test_a_rank_killed_by_a_signal_is_reported_with_it(tmp_path):
    contract, env = _node(tmp_path, ["python", "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"])
    proc = _start(env)
    proc.communicate(timeout=60)
    outcome = json.loads((contract.node_dir / "exit.json").read_text())
    assert outcome["reason"]["kind"] == "exit.nonzero"
    assert outcome["reason"]["signal"] == signal.SIGKILL
    assert outcome["exit_code"] == 128 + signal.SIGKILL


def test_multi_rank_nodes_go_through_torchrun_with_static_rendezvous(tmp_path):
    cmd = rank_command(agent_config(tmp_path, procs_per_node=4, master_addr="10.0.0.1", master_port=1234))
    assert cmd[1:3] == ["-m", "torch.distributed.run"]
    assert "--nnodes=2" in cmd and "--nproc-per-node=4" in cmd and "--node-rank=1" in cmd
    assert "--master-addr=10.0.0.1" in cmd and "--master-port=1234" in cmd
    assert cmd[-6:] == [sys.executable, "-m", "agent.rank", "--", "python", "t.py"]


def test_with_in_place_restarts_a_dead_rank_takes_its_group_down_at_once(tmp_path):
    """A rank killed with SIGKILL fails the attempt: with in-place restarts on, the agent kills the
    rest of its group (here a rank that ignores SIGTERM) at once, not after torchrun's SIGTERM
    grace, and reports the dead rank as the cause."""
    script = (
        "import os, signal, time\n"
        "if os.environ['RANK'] == '1':\n"
        "    signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(600)\n"
        "time.sleep(2); os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    contract, env = _node(tmp_path, ["python", "-c", script], procs_per_node=2)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env.update({"AERIE_MASTER_ADDR": "127.0.0.1", "AERIE_MASTER_PORT": str(port), "AERIE_IN_PLACE_WAIT_S": "30"})
    log_path = tmp_path / "node.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "agent.entrypoint"], env=env, cwd=REPO, stdout=log, stderr=log)
        proc.wait(timeout=120)
    logged = log_path.read_text()
    assert "rank 0 on algo-1 exited with code 137: its group is killed now" in logged, logged[-3000:]
    outcome = json.loads((contract.node_dir / "exit.json").read_text())
    assert outcome["reason"]["kind"] == "exit.nonzero" and outcome["reason"]["rank"] == 0
    assert outcome["reason"]["signal"] == signal.SIGKILL
    survivor = int((contract.node_dir / "ranks" / "rank-1.pid").read_text())
    assert not _alive(survivor)
