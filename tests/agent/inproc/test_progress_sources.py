"""agent/probes/progress.py with the probe beside another source (hand-made records): a source
going backwards never moves the rank's step back, and each optimizer step counts once."""

from __future__ import annotations

from agent.probes.progress import ProgressProbe


def _step(t: float, step: int, source: str | None, loss: float | None = 1.0, rank: int = 0) -> dict:
    return {"t": t, "rank": rank, "step": step, "loss": loss, "event": None, "source": source}


def _probe(tmp_path) -> ProgressProbe:
    return ProgressProbe(tmp_path / "none")


def test_a_log_going_backwards_is_liveness_not_a_step_back(tmp_path):
    p = _probe(tmp_path)
    for t, step in enumerate([248, 249, 100, 101, 132]):  # Lightning's bar after a resumed epoch
        assert p.ingest(_step(float(t), step, "log"))
    assert [s[1] for s in p.steps[0]] == [248, 249, 249, 249, 249]
    assert p.last_step() == 249 and p.last_step_t() == 4.0  # still alive, never behind


def test_probe_steps_count_once_and_the_log_only_adds_beyond_them(tmp_path):
    p = _probe(tmp_path)
    assert p.ingest(_step(1.0, 1, "probe", loss=None))
    assert p.ingest(_step(1.1, 1, "log", loss=2.5))  # fills the probe step's missing loss
    assert not p.ingest(_step(1.2, 1, "log"))  # nothing more to add: not a second step
    assert not p.ingest(_step(1.3, 1, "probe"))  # the same probe step again
    assert p.ingest(_step(2.0, 2, "probe"))
    assert [(s[1], s[2]) for s in p.steps[0]] == [(1, 2.5), (2, 1.0)]
    assert p.repeated == 2


def test_a_probe_numbered_below_the_log_still_moves_liveness(tmp_path):
    """A resumed run's log says 1001 while an optimizer without state counts from 1 again."""
    p = _probe(tmp_path)
    p.ingest(_step(1.0, 1001, "log"))
    for t, step in ((2.0, 1), (3.0, 2), (4.0, 3)):
        assert p.ingest(_step(t, step, "probe"))
    assert [s[1] for s in p.steps[0]] == [1001] * 4
    assert p.last_step_t() == 4.0
    assert p.ingest(_step(5.0, 1010, "log")) and p.last_step() == 1010  # the log beyond: a new step


def test_the_shown_step_is_the_highest_source(tmp_path):
    p = _probe(tmp_path)
    p.ingest(_step(1.0, 5, "probe"))
    p.ingest(_step(1.1, 3, "log"))  # behind the probe: folded, no new step
    p.ingest(_step(2.0, 6, "probe"))
    assert [s[1] for s in p.steps[0]] == [5, 6] and p.last_step() == 6
