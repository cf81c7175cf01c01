"""Issue 33, acceptance 2: one rank stuck in a Python loop outside any collective while its peer
waits in `all_reduce` (or inside DDP's `backward()`, where the reducer's all-reduce waits): the
stop-time diagnosis names the stuck rank and its function, not the peer, in 10 of 10 runs.

Each run is two real ranks of a gloo process group with the in-process probe injected as
`agent.rank` injects it (`agent.inproc.child_env`); the diagnosis is the agent's own
(`agent/diagnose.py`: the probe's stack signal, its state files) and the reading is the control
plane's (`recovery.hang_root`), as a `silent.hang` verdict carries them.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time

import pytest

from agent import inproc
from agent.diagnose import diagnose
from recovery.hang_root import find_root_cause, views_from_verdicts

pytestmark = [pytest.mark.slow, pytest.mark.side_by_side]

RUNS = 10
RANK = """
import os, sys, torch, torch.distributed as dist
rank, mode, port, ready = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
model = torch.nn.Linear(4, 1)
if mode == "ddp":
    model = torch.nn.parallel.DistributedDataParallel(model)


def spin_in_my_own_code():
    open(ready + str(rank), "w").close()
    while True:
        sum(range(1000))


if rank == 1:
    spin_in_my_own_code()
open(ready + str(rank), "w").close()
if mode == "ddp":
    model(torch.ones(2, 4)).sum().backward()  # waits in the reducer's all-reduce for rank 1
else:
    dist.all_reduce(torch.ones(1))  # waits for rank 1
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _one_run(run, n: int) -> str:
    mode = ("collective", "ddp")[n % 2]
    base = run.tmp / f"run-{n}"
    node_dir, ranks = base / "agent", base / "agent" / "ranks"
    ranks.mkdir(parents=True)
    script = run.script(RANK, f"rank-{n}.py")
    env = inproc.child_env(
        run.env(AERIE_NODE_DIR=str(node_dir), AERIE_METRICS_PATH=str(base / "metrics"), OMP_NUM_THREADS="1")
    )
    port, ready = str(_free_port()), str(base / "ready-")
    procs = [subprocess.Popen([sys.executable, str(script), str(r), mode, port, ready], env=env) for r in (0, 1)]
    try:
        for r, p in enumerate(procs):
            (ranks / f"rank-{r}.pid").write_text(str(p.pid))  # as agent.rank writes it
        deadline = time.time() + 120
        while not all((base / f"ready-{r}").exists() for r in (0, 1)):
            assert time.time() < deadline and all(p.poll() is None for p in procs), f"run {n}: the ranks did not start"
            time.sleep(0.1)
        time.sleep(1.0)  # rank 0 is inside its collective by now
        found = diagnose(ranks)
        verdict = {"host": "algo-1", "kind": "silent.hang", "t": 1.0, "evidence": {"ranks": found}}
        root = find_root_cause(views_from_verdicts([verdict]))
        assert root is not None, (n, mode, found)
        assert [(r.host, r.rank) for r in root.culprits] == [("algo-1", "1")], (n, mode, root.message, found)
        assert "spin_in_my_own_code()" in root.message and "1 rank(s) wait in" in root.message, (n, mode, root.message)
        return root.message
    finally:
        for p in procs:
            p.send_signal(signal.SIGKILL)
            p.wait()


def test_the_stuck_rank_and_its_function_are_named_in_10_of_10_runs(run):
    messages = [_one_run(run, n) for n in range(RUNS)]
    assert len(messages) == RUNS
    print("\n".join(messages))
