"""The rank a hang waits for (`recovery/hang_root.py`), from real stacks of real ranks.

The two-rank cases run real gloo process groups: one rank stuck in its own Python loop while its
peer waits in `all_reduce` (or, under DDP, inside `backward()`, where the reducer's all-reduce
waits); each rank registers `faulthandler` on the probe's stack signal, as the in-process probe
does (aerie_contracts.probe), and the test sends it, as the agent does at stop time.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from aerie_contracts.probe import stack_signal
from recovery.hang_root import find_root_cause, main_thread_frames, rank_view, views_from_verdicts

RANK = textwrap.dedent(
    """
    import faulthandler, os, signal, sys, time
    import torch
    import torch.distributed as dist

    rank, mode, port, out = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
    stacks = open(os.path.join(out, f"rank-{rank}.stacks"), "w")
    faulthandler.register(int(sys.argv[5]), file=stacks, all_threads=True, chain=False)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)

    def spin_in_my_own_code():
        open(os.path.join(out, f"ready-{rank}"), "w").close()
        while True:
            sum(range(1000))

    model = torch.nn.Linear(4, 1)
    if mode == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(model)
    open(os.path.join(out, f"ready-{rank}"), "w").close() if rank == 0 else None
    if rank == 1:
        spin_in_my_own_code()
    elif mode == "ddp":
        model(torch.ones(2, 4)).sum().backward()  # waits in the reducer's all-reduce for rank 1
    else:
        dist.all_reduce(torch.ones(1))  # waits for rank 1
    """
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stacks_of_a_hang(tmp_path: Path, mode: str) -> dict[str, dict]:
    sig = stack_signal()
    if sig is None:
        pytest.skip("no real-time signals here")
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    port = str(_free_port())
    procs = [
        subprocess.Popen([sys.executable, str(script), str(r), mode, port, str(tmp_path), str(sig)]) for r in (0, 1)
    ]
    try:
        deadline = time.time() + 60
        while not all((tmp_path / f"ready-{r}").exists() for r in (0, 1)):
            assert time.time() < deadline and all(p.poll() is None for p in procs), "the ranks did not start"
            time.sleep(0.1)
        time.sleep(1.0)  # rank 0 is inside its collective by now
        for p in procs:
            os.kill(p.pid, sig)
        views = {}
        for r in (0, 1):
            path = tmp_path / f"rank-{r}.stacks"
            deadline = time.time() + 10
            while "Current thread" not in path.read_text():
                assert time.time() < deadline, f"rank {r} wrote no stacks"
                time.sleep(0.1)
            time.sleep(0.2)
            views[str(r)] = {"answered": True, "process_state": "running", "stack": path.read_text()}
        return views
    finally:
        for p in procs:
            p.send_signal(signal.SIGKILL)
            p.wait()


@pytest.mark.parametrize("mode", ["collective", "ddp"])
def test_the_rank_stuck_in_its_own_code_is_named_not_the_peer_waiting_for_it(tmp_path, mode):
    ranks = _stacks_of_a_hang(tmp_path, mode)
    verdict = {"host": "algo-1", "kind": "silent.hang", "t": 1.0, "evidence": {"ranks": ranks}}
    views = views_from_verdicts([verdict])
    waiting = next(v for v in views if v.rank == "0")
    assert waiting.waiting, ranks["0"]["stack"]
    root = find_root_cause(views)
    assert root is not None and [(r.host, r.rank) for r in root.culprits] == [("algo-1", "1")], ranks
    assert "rank.py" in root.message and "spin_in_my_own_code()" in root.message, root.message
    assert "1 rank(s) wait in" in root.message, root.message


def _stack(*frames: tuple[str, int, str]) -> str:
    body = "\n".join(f'  File "{f}", line {n} in {fn}' for f, n, fn in frames)
    other = 'Thread 0x1 (most recent call first):\n  File "x.py", line 1 in run\n\n'
    return f"{other}Current thread 0x2 (most recent call first):\n{body}\n"


WAIT = ("/v/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", 2800, "all_reduce")
PROBE = ("/repo/agent/inproc/hooks.py", 40, "wrapped")
USER = ("/job/train.py", 88, "main")
LOADER = ("/job/data/loader.py", 88, "__next__")


def _rank(stack: str | None, **kw) -> dict:
    return {"answered": stack is not None, "process_state": "sleeping", "stack": stack or "", **kw}


def test_the_last_dump_of_the_main_thread_is_read_and_the_probes_frames_are_skipped():
    text = _stack(LOADER, USER) + _stack(PROBE, WAIT, USER)
    frames = main_thread_frames(text)
    assert [f[2] for f in frames] == ["wrapped", "all_reduce", "main"]
    view = rank_view("algo-1", "0", _rank(text))
    assert view.waiting and view.frame == "job/train.py:88 main()"


def test_a_stopped_rank_and_one_behind_in_its_collectives_are_the_cause():
    views = [
        rank_view("algo-1", "0", _rank(_stack(WAIT, USER), collectives=12)),
        rank_view("algo-1", "1", _rank(_stack(WAIT, USER), collectives=12)),
        rank_view("algo-2", "2", _rank(_stack(WAIT, USER), collectives=12)),
        rank_view("algo-2", "3", {"answered": False, "process_state": "stopped", "collectives": 11}),
    ]
    root = find_root_cause(views)
    assert root is not None and root.hosts == ["algo-2"] and "(stopped or gone)" in root.message
    assert "3 rank(s) wait in a collective #12" in root.message, root.message

    behind = [
        rank_view("algo-1", "0", _rank(_stack(WAIT, USER), collectives=12, in_collective="all_reduce")),
        rank_view("algo-2", "2", _rank(_stack(WAIT, USER), collectives=11, in_collective="broadcast")),
    ]
    root = find_root_cause(behind)
    assert root is not None and root.hosts == ["algo-2"] and "behind at collective #11" in root.message


def test_ranks_that_answered_with_no_python_frame_are_left_out():
    """CI, 2026-12-03: algo-2's verdict came 1.4 s after algo-1 had stopped its ranks; algo-2's
    ranks, their collective broken, were exiting and dumped "Garbage-collecting, <no Python
    frame>". Counted as silent they made both nodes culprits and no rank was singled out."""
    exiting = "Current thread 0x00007fd9d1fd5b80 (most recent call first):\n  Garbage-collecting\n  <no Python frame>\n"
    views = [
        rank_view("algo-1", "0", _rank(_stack(WAIT, USER), collectives=27)),
        rank_view(
            "algo-1", "1", {"answered": False, "process_state": "stopped", "collectives": 26, "stack": _stack(USER)}
        ),
        rank_view("algo-2", "2", {"answered": True, "process_state": "running", "collectives": 27, "stack": exiting}),
        rank_view("algo-2", "3", {"answered": True, "process_state": "running", "collectives": 27, "stack": exiting}),
    ]
    assert [v.frameless for v in views] == [False, False, True, True]
    root = find_root_cause(views)
    assert (
        root is not None and root.hosts == ["algo-1"] and "rank 1 on algo-1 in job/train.py:88 main()" in root.message
    )
    assert "(stopped or gone)" in root.message, root.message


def test_every_rank_waiting_alike_or_nothing_known_singles_out_none():
    alike = [rank_view(h, str(r), _rank(_stack(WAIT, USER), collectives=5)) for r, h in enumerate(["a", "a", "b"])]
    assert find_root_cause(alike) is None
    assert find_root_cause([rank_view("a", str(r), _rank(None)) for r in range(4)]) is None  # no probe
    assert find_root_cause(alike[:1]) is None


def test_blame_names_the_waited_for_node_before_the_older_rules():
    from recovery.blame import blame_attempt

    def verdict(host: str, ranks: dict) -> dict:
        return {"attempt_id": "j-a1", "host": host, "kind": "silent.hang", "t": 10.0, "evidence": {"ranks": ranks}}

    verdicts = [
        verdict("algo-1", {"0": _rank(_stack(WAIT, USER)), "1": _rank(_stack(WAIT, USER))}),
        verdict("algo-2", {"2": _rank(_stack(WAIT, USER)), "3": _rank(_stack(LOADER, USER))}),
    ]
    job = {"spec": {}, "verdicts": verdicts}
    failed = {
        "id": "j-a1",
        "reason": {"kind": "silent.hang", "host": "algo-1"},
        "nodes": [{"host": "algo-1"}, {"host": "algo-2"}],
    }
    blames, why = blame_attempt(job, failed)
    assert [(b["host"], b["rule"]) for b in blames] == [("algo-2", "waited_for")], why
    assert "rank 3 on algo-2 in data/loader.py:88 __next__()" in blames[0]["why"], blames[0]["why"]
    assert "3 rank(s) wait in" in why
