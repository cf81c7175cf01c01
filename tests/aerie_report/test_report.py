"""`aerie_report.report()` writes Aerie's metrics contract, read by the agent like Aerie's own trainer's."""

from __future__ import annotations

import json
import math

from aerie_contracts import byo
from aerie_contracts.health import HealthSettings
from aerie_report import metrics_path, report
from agent.detect import detect_all
from agent.monitor import Observations
from agent.probes.progress import ProgressProbe


def test_report_writes_the_contract_the_agent_reads(tmp_path, monkeypatch):
    monkeypatch.setenv("AERIE_METRICS_PATH", str(tmp_path))
    monkeypatch.setenv("RANK", "3")
    for step in range(1, 4):
        assert report(step=step, loss=4.0 - step, grad_norm=1.5, lr=1e-3, tokens_per_s=100)
    assert report(step=4, loss=float("nan"))
    lines = [json.loads(x) for x in (tmp_path / "rank-00003.jsonl").read_text().splitlines()]
    assert set(lines[0]) >= {"t", "rank", "step", "loss", "grad_norm", "lr", "tokens", "step_s", "event"}
    assert lines[0]["rank"] == 3 and lines[0]["event"] is None and lines[0][byo.SOURCE_KEY] == byo.SOURCE_REPORT
    assert lines[0]["tokens_per_s"] == 100 and math.isnan(lines[3]["loss"])

    probe = ProgressProbe(tmp_path)
    obs = Observations(probe, HealthSettings.from_dict({}))
    obs.add({"now": lines[-1]["t"] + 1, "records": probe.sample()})
    assert probe.last_step() == 4
    verdicts = detect_all(obs.window(lines[-1]["t"] + 1, 0.0), HealthSettings.from_dict({"startup_grace_s": 0}))
    assert [v.kind for v in verdicts] == ["loss.nan"]  # the reported NaN reaches the detectors


def test_outside_aerie_report_does_nothing(tmp_path, monkeypatch):
    for name in ("AERIE_METRICS_PATH", "AERIE_ML_ROOT", "SM_OUTPUT_DATA_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    assert metrics_path() is None and report(step=1, loss=1.0) is False
    assert list(tmp_path.iterdir()) == []


def test_ml_root_fallback_and_bad_values(tmp_path, monkeypatch):
    monkeypatch.delenv("AERIE_METRICS_PATH", raising=False)
    monkeypatch.delenv("SM_OUTPUT_DATA_DIR", raising=False)
    monkeypatch.setenv("AERIE_ML_ROOT", str(tmp_path))
    monkeypatch.delenv("RANK", raising=False)
    assert metrics_path() == tmp_path / "output" / "metrics" / "rank-00000.jsonl"
    assert report(step=1, loss="not a number", lr=object())  # junk metrics become null, the step stays
    rec = json.loads(metrics_path().read_text())
    assert rec["step"] == 1 and rec["loss"] is None and rec["lr"] is None
