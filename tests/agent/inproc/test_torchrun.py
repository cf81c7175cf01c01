"""Two ranks under torchrun, each under `agent.rank` as the agent starts them (gloo, DDP): the probe
is injected with no change to the command, and each rank's records count its collectives."""

from __future__ import annotations

import json
import math
import shutil
import socket
import sys

from aerie_contracts import probe as contract

from .conftest import REPO

ABORT_AT_EXIT = "terminate called without an active exception"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


DDP = """
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("gloo")
torch.manual_seed(0)
model = DDP(torch.nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
for _ in range(4):
    x = torch.randn(16, 8)
    loss = (model(x) - x.sum(1, keepdim=True)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    dist.all_reduce(loss.detach())  # the loss, averaged for logging, as loops do
dist.barrier()
dist.destroy_process_group()
"""


def test_two_ranks_report_their_collectives(run):
    script = run.script(DDP)
    env = run.env(PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", SM_CURRENT_HOST="algo-1", GLOO_SOCKET_IFNAME="lo")
    argv = ["-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1"]
    argv += ["--master-port", str(_free_port()), "--no-python"]
    argv += [sys.executable, "-m", "agent.rank", "--", "python", str(script)]
    for _ in range(3):
        proc = run.python(argv, env, inject=False, timeout=120)  # agent.rank injects it
        # gloo can abort a rank in interpreter finalization after all its work, its group destroyed
        # (pytorch/pytorch#179291; measured here 2026-12-03: 2 runs in 10 without the probe, 1 in
        # 10 with it): not what this test is about, so that one failure is run again.
        if proc.returncode == 0 or ABORT_AT_EXIT not in proc.stdout + proc.stderr:
            break
        for stale in (run.metrics, run.ranks):
            shutil.rmtree(stale, ignore_errors=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for rank in (0, 1):
        steps = run.steps(rank)
        assert [r["step"] for r in steps] == [1, 2, 3, 4], run.records(rank)
        assert all(r["rank"] == rank and math.isfinite(r["loss"]) for r in steps)
        # each step sees the previous step's loss all_reduce (the first, none); DDP's reducer is C++
        assert [r[contract.COLLECTIVES] for r in steps] == [0, 1, 1, 1]
        state = json.loads((run.ranks / contract.STATE_FILE.format(rank=rank)).read_text())
        assert state[contract.STATE_COLLECTIVES] == 5 and state[contract.STATE_IN_COLLECTIVE] is None


LEFT_INITIALIZED = """
import atexit, sys, torch, torch.distributed as dist
atexit.register(lambda: print(f"initialized at exit: {dist.is_initialized()}", flush=True))
dist.init_process_group("gloo")
t = torch.ones(2)
dist.all_reduce(t)
if sys.argv[1:] == ["fail"]:
    raise RuntimeError("the script fails")
# no destroy_process_group(), as Lightning leaves it
"""


def test_gloo_left_initialized_is_destroyed_at_exit_unless_an_exception_ends_the_rank(run):
    """pytorch/pytorch#179291: a gloo group left for finalization can abort a rank (SIGABRT) after
    all its work; the probe destroys it at exit (an exit handler registered before
    init_process_group runs after the probe's, and sees it destroyed). An exception ends the rank:
    left as it is (a destroy could wait on a peer)."""
    env = run.env(PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", SM_CURRENT_HOST="algo-1", GLOO_SOCKET_IFNAME="lo")
    for mode, expect, code in (("ok", "False", 0), ("fail", "True", 1)):
        script = run.script(LEFT_INITIALIZED)
        argv = ["-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1"]
        argv += ["--master-port", str(_free_port()), "--no-python"]
        argv += [sys.executable, "-m", "agent.rank", "--", "python", str(script), mode]
        proc = run.python(argv, env, inject=False, timeout=120)
        out = proc.stdout + proc.stderr
        assert (proc.returncode == 0) == (code == 0), out[-3000:]
        assert "initialized at exit: " + expect in out, out[-3000:]
        assert "initialized at exit: " + ("True" if expect == "False" else "False") not in out, out[-3000:]
