"""MetricsWriter: the contract's JSONL stream and the TensorBoard scalars; pricing tables."""

from __future__ import annotations

import json
import math
import threading

import pytest

from trainer import pricing
from trainer.metrics import TENSORBOARD_SCALARS, MetricsWriter, metrics_dir, tensorboard_dir

CONTRACT_KEYS = ["t", "rank", "step", "loss", "grad_norm", "lr", "tokens", "step_s", "event"]


def lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_jsonl_lines_follow_the_contract_and_are_flushed_each_step(tmp_path):
    writer = MetricsWriter(3, directory=tmp_path / "m", enable_tensorboard=False)
    assert writer.path == tmp_path / "m" / "rank-00003.jsonl"
    writer.step(
        1, loss=2.5, grad_norm=0.7, lr=1e-3, tokens=4096, step_s=0.25, mfu=0.4, tokens_per_s=1e4, tokens_per_dollar=None
    )
    # Flushed before close: the agent tails the file while the trainer runs.
    (record,) = lines(writer.path)
    assert list(record)[:9] == CONTRACT_KEYS
    assert record["rank"] == 3 and record["step"] == 1 and record["event"] is None
    assert record["loss"] == 2.5 and record["tokens"] == 4096 and record["mfu"] == 0.4
    writer.event("checkpoint_committed", 20, uri="s3://b/ckpt/step_00000020")
    writer.step(2, loss=float("nan"), grad_norm=float("inf"), lr=1e-3, tokens=8192, step_s=0.25)
    writer.close()
    _, event, nan_step = lines(writer.path)
    assert event["event"] == "checkpoint_committed" and event["uri"].endswith("step_00000020")
    assert all(event[k] is None for k in ("loss", "grad_norm", "lr", "tokens", "step_s"))
    assert math.isnan(nan_step["loss"]) and math.isinf(nan_step["grad_norm"])  # the agent must see NaN


def test_appends_across_restarts_and_is_thread_safe(tmp_path):
    first = MetricsWriter(0, directory=tmp_path, enable_tensorboard=False)
    first.step(1, loss=1.0, grad_norm=1.0, lr=1.0, tokens=1, step_s=1.0)
    first.close()
    second = MetricsWriter(0, directory=tmp_path, enable_tensorboard=False)
    threads = [
        threading.Thread(target=lambda i=i: [second.event("eval_begin", i) for _ in range(50)]) for i in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    second.close()
    records = lines(second.path)
    assert len(records) == 1 + 200


def test_default_locations_follow_the_container_contract(tmp_path, monkeypatch):
    monkeypatch.delenv("AERIE_METRICS_PATH", raising=False)
    monkeypatch.delenv("SM_OUTPUT_DATA_DIR", raising=False)
    monkeypatch.setenv("AERIE_ML_ROOT", str(tmp_path))
    assert metrics_dir() == tmp_path / "output" / "metrics"
    assert tensorboard_dir() == tmp_path / "output" / "tensorboard"
    monkeypatch.setenv("SM_OUTPUT_DATA_DIR", str(tmp_path / "sm"))
    monkeypatch.setenv("AERIE_METRICS_PATH", str(tmp_path / "stream"))
    assert metrics_dir() == tmp_path / "stream"
    assert tensorboard_dir() == tmp_path / "sm" / "tensorboard"


def test_tensorboard_has_every_scalar_on_rank_0_only(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tb = tmp_path / "tb"
    writer = MetricsWriter(0, directory=tmp_path, tensorboard=tb)
    for step in (1, 2, 3):
        writer.step(
            step,
            loss=3.0 / step,
            grad_norm=1.0,
            lr=1e-3,
            tokens=step * 100,
            step_s=0.1,
            tokens_per_s=1000.0,
            mfu=0.3,
            tokens_per_dollar=2e7,
        )
    writer.scalars(3, eval_loss=1.5)
    writer.close()
    other = MetricsWriter(1, directory=tmp_path, tensorboard=tmp_path / "tb1")
    other.close()
    assert not (tmp_path / "tb1").exists()
    acc = EventAccumulator(str(tb))
    acc.Reload()
    assert set(acc.Tags()["scalars"]) == set(TENSORBOARD_SCALARS)
    assert [e.value for e in acc.Scalars("loss")] == pytest.approx([3.0, 1.5, 1.0])


def test_pricing_tables_and_overrides():
    assert pricing.device_peak_flops("NVIDIA H100 80GB HBM3") == pytest.approx(989.4e12)
    assert pricing.device_peak_flops("NVIDIA H100 PCIe") == pytest.approx(756e12)
    assert pricing.device_peak_flops("NVIDIA H200") == pytest.approx(989.4e12)
    assert pricing.device_peak_flops("NVIDIA A100-SXM4-40GB") == pytest.approx(312e12)
    assert pricing.device_peak_flops(None, override=5e12) == 5e12
    assert 1e9 < pricing.device_peak_flops(None) < 1e14  # CPU estimate: threads x clock x FLOPs/cycle
    # bf16 matmuls (precision: bf16) are held to the bf16 peak: higher where the CPU has AMX or
    # AVX-512-BF16, the fp32 one where it has neither.
    assert pricing.device_peak_flops(None, bf16=True) >= pricing.device_peak_flops(None)
    assert pricing.device_peak_flops("NVIDIA H100 PCIe", bf16=True) == pytest.approx(756e12)
    assert pricing.instance_price("ml.p4d.24xlarge") == pricing.instance_price("p4d.24xlarge") > 0
    assert pricing.instance_price("trn1.32xlarge") > 0 and pricing.instance_price("p5.48xlarge") > 0
    assert pricing.instance_price("local") is None
    assert pricing.instance_price("local", override=2.0) == 2.0
    assert pricing.tokens_per_dollar(1000.0, 3.6, 2) == pytest.approx(500_000.0)
    assert pricing.tokens_per_dollar(1000.0, None, 2) is None
