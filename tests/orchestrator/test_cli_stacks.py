"""`aerie describe`'s (and the dashboard's) stacks at stop time: a line per rank from the hang verdicts' `ranks`
evidence (agent/diagnose.py), the root cause marked, and its main thread's innermost frames."""

from __future__ import annotations

from orchestrator.stacks_view import stop_time_lines as _stacks_at_stop


def _stack(*frames: tuple[str, int, str]) -> str:
    body = "\n".join(f'  File "{f}", line {n} in {fn}' for f, n, fn in frames)
    return f"Current thread 0x2 (most recent call first):\n{body}\n"


WAIT = ("/v/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", 2800, "all_reduce")
USER = ("/job/train.py", 40, "main")
LOADER = ("/job/data/loader.py", 88, "__next__")


def _rank(stack: str, **kw) -> dict:
    return {"answered": True, "process_state": "sleeping", "stack": stack, "collectives": 12, **kw}


def test_each_rank_on_a_line_and_the_root_causes_frames():
    verdicts = [
        {
            "attempt_id": "j-a1",
            "host": "algo-1",
            "kind": "silent.hang",
            "t": 1.0,
            "evidence": {"ranks": {"0": _rank(_stack(WAIT, USER), in_collective="all_reduce")}},
        },
        {
            "attempt_id": "j-a1",
            "host": "algo-2",
            "kind": "silent.hang",
            "t": 1.2,
            "evidence": {"ranks": {"1": _rank(_stack(LOADER, USER))}},
        },
        {"attempt_id": "j-a1", "host": "algo-2", "kind": "node.straggler", "t": 0.5, "evidence": {}},
    ]
    lines = _stacks_at_stop(verdicts)
    assert lines[0].startswith("stacks at stop time, j-a1: root cause: rank 1 on algo-2 in data/loader.py:88"), lines
    assert "  algo-1 rank 0: waiting in all_reduce, 12 collectives; at job/train.py:40 main()" in lines
    assert "  algo-2 rank 1: not waiting, 12 collectives; at data/loader.py:88 __next__()  <- root cause" in lines
    assert lines[-2:] == ["      /job/data/loader.py:88 __next__()", "      /job/train.py:40 main()"]


def test_no_ranks_no_lines():
    assert _stacks_at_stop([{"attempt_id": "j-a1", "host": "a", "kind": "silent.hang", "t": 1, "evidence": {}}]) == []
