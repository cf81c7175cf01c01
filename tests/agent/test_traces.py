"""Recorded traces (real processes through the real probes, see record_traces.py) replayed
through the live code path: each fault gets its verdict, and clean runs get none."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from aerie_contracts.health import HealthSettings
from agent.monitor import load_trace, replay

TRACES = Path(__file__).resolve().parents[1] / "data" / "traces"
ALL = sorted(TRACES.glob("*.jsonl"))
CLEAN = [p for p in ALL if p.name.startswith("clean")]
FAULTY = [p for p in ALL if not p.name.startswith("clean")]


def test_traces_are_present_and_small():
    assert CLEAN and len(FAULTY) >= 5, [p.name for p in ALL]
    for p in ALL:
        assert p.stat().st_size < 200 * 1024, p.name


@pytest.mark.parametrize("path", FAULTY, ids=lambda p: p.stem)
def test_fault_trace_fires_its_verdict_first(path):
    header, samples = load_trace(path)
    fired = replay(samples, header["health"], header["started_at"])
    assert fired, f"{path.name}: no verdict"
    _t, first = fired[0]
    assert first.kind == header["expect"][0], [(round(t - header["started_at"], 1), v.kind) for t, v in fired]
    json.dumps(first.evidence, allow_nan=False)
    assert "window" in first.evidence


@pytest.mark.parametrize("path", CLEAN, ids=lambda p: p.stem)
@pytest.mark.parametrize("health", ["trace", "defaults"])
def test_clean_trace_raises_nothing(path, health):
    header, samples = load_trace(path)
    cfg = header["health"] if health == "trace" else {}
    assert replay(samples, cfg, header["started_at"]) == []


def first_verdict(name: str):
    header, samples = load_trace(TRACES / f"{name}.jsonl")
    t, v = replay(samples, header["health"], header["started_at"])[0]
    return header, t, v


def test_sigstop_is_an_idle_hang_naming_the_stopped_rank():
    _, _, v = first_verdict("sigstop")
    assert v.evidence["state"] == "idle"
    assert [p["rank"] for p in v.evidence["stopped"]] == [1]


def test_busy_spin_is_a_busy_hang():
    _, _, v = first_verdict("busy_spin")
    assert v.evidence["state"] == "busy" and "1" in v.evidence["busy"]


def test_hang_is_detected_within_the_goal():
    """Issue 7 goal: time-to-detect <= max(30 s, 3 x p95 step time) after the last step."""
    for name in ("sigstop", "busy_spin"):
        _header, t, v = first_verdict(name)
        last_step_t = t - v.evidence["stalled_s"]
        assert t - last_step_t <= max(30.0, 3 * (v.evidence["step_time_p95"] or 0)) + 2 * HealthSettings().sample_s


def test_nic_traces_name_the_link():
    for path in TRACES.glob("nic_*.jsonl"):
        _, _, v = first_verdict(path.stem)
        assert v.kind == "silent.nic_stall" and v.evidence["interface"] in v.message
