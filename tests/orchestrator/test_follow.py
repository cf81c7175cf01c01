"""`aerie submit --follow`'s condensed view (orchestrator/follow.py): a peer's traceback from a
broken collective is one line after the attempt's root cause; every other line, and every other
traceback, is printed as it came. The collateral traceback is torch's own output (recorded:
tests/data/logs/gloo_peer_reset.log)."""

from __future__ import annotations

from pathlib import Path

from orchestrator.follow import LogCondenser, root_cause

RECORDED = (Path(__file__).resolve().parents[1] / "data" / "logs" / "gloo_peer_reset.log").read_text()


def _as(host: str, rank: int, text: str) -> str:
    return text.replace("[algo-1 rank 0] ", f"[{host} rank {rank}] ").replace("[rank0]", f"[rank{rank}]")


def test_collateral_tracebacks_are_one_line_after_the_root_cause():
    c = LogCondenser()
    step = "[algo-2 rank 2] step 150/400 loss 3.4697\n"
    out = c.feed("algo-2", step + _as("algo-2", 2, RECORDED))
    # Fed in pieces that split lines: the partial line waits for its end.
    third = _as("algo-2", 3, RECORDED)
    out += c.feed("algo-2", third[:100]) + c.feed("algo-2", third[100:])
    out += c.feed("algo-1", "[agent 2026-12-01 23:53:02,454] ERROR verdict silent.hang on algo-1\n")
    assert out == step + "[agent 2026-12-01 23:53:02,454] ERROR verdict silent.hang on algo-1\n"
    attempt = {"id": "j-a2", "reason": {"kind": "node.lost", "host": "algo-1", "message": "no heartbeat for 12s"}}
    host, cause = root_cause({"blames": [], "verdicts": []}, attempt)
    summary = c.attempt_ended(host, cause, "aerie logs demo --attempt 2")
    assert summary.splitlines() == [
        "root cause: node.lost on algo-1: no heartbeat for 12s",
        "[algo-2] ranks 2, 3: collective broken by algo-1's failure (tracebacks: aerie logs demo --attempt 2)",
    ]
    assert c.attempt_ended(None, None, "x") == ""  # reset for the next attempt


def test_a_traceback_that_is_not_collateral_is_printed_whole_and_at_once():
    c = LogCondenser()
    crash = (
        "[algo-1 rank 1] Traceback (most recent call last):\n"
        '[algo-1 rank 1]   File "train.py", line 88, in <module>\n'
        "[algo-1 rank 1]     batch = next(loader)\n"
        "[algo-1 rank 1] KeyError: 'input_ids'\n"
    )
    interleaved = "[algo-1 rank 0] step 12/40 loss 2.0\n"
    first = crash.index("\n") + 1
    out = c.feed("algo-1", crash[:first] + interleaved + crash[first:])
    # The other rank's line is not held up by the traceback being read.
    assert out == interleaved + crash
    assert c.attempt_ended("algo-1", "exit.nonzero on algo-1", "x") == "root cause: exit.nonzero on algo-1\n"


def test_the_blamed_node_is_the_root_cause_not_the_first_report():
    """At a hang the attempt's reason is whichever node reported first (often the peer that saw
    its accelerators idle); chaining's blame names the node that caused it."""
    attempt = {"id": "j-a1", "reason": {"kind": "silent.hang", "host": "algo-2", "message": "accelerators idle"}}
    job = {
        "blames": [
            {"attempt_id": "j-a1", "host": "algo-1", "kind": "silent.hang", "rule": "not_waiting", "why": "busy"}
        ],
        "verdicts": [
            {"attempt_id": "j-a1", "host": "algo-2", "message": "accelerators idle"},
            {"attempt_id": "j-a1", "host": "algo-1", "message": "accelerators busy while no step completes"},
        ],
    }
    assert root_cause(job, attempt) == ("algo-1", "silent.hang on algo-1: accelerators busy while no step completes")
    job["verdicts"] = job["verdicts"][:1]
    assert root_cause(job, attempt) == ("algo-1", "silent.hang on algo-1 (not_waiting: busy)")


def test_an_unfinished_traceback_is_not_lost_when_the_attempt_ends():
    c = LogCondenser()
    assert c.feed("algo-1", "[algo-1 rank 0] Traceback (most recent call last):\n") == ""
    assert c.attempt_ended(None, None, "x") == "[algo-1 rank 0] Traceback (most recent call last):\n"
