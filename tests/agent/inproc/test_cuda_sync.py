"""The probe adds no device synchronisation to the step path (issue #33, acceptance 4): a CUDA loop
run under torch's profiler with the probe on and off, its synchronisations counted. Needs an
NVIDIA GPU (skipped without one: the loss a CPU loop hands the probe is read at once)."""

from __future__ import annotations

import json

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU (CUDA)")

SYNCS = ("cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize")

LOOP = f"""
SYNCS = {SYNCS!r}
import json, torch
from torch.profiler import ProfilerActivity, profile
model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1)).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
x = torch.randn(64, 256, device="cuda")
def steps(n):
    for _ in range(n):
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
steps(5)
torch.cuda.synchronize()
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    steps(20)
torch.cuda.synchronize()
names = [e.name for e in prof.events()]
print(json.dumps({{s: names.count(s) for s in SYNCS}}))
"""


def _syncs(run, probe: str) -> dict[str, int]:
    proc = run.python([str(run.script(LOOP, f"loop_{probe}.py"))], run.env(AERIE_PROBE=probe), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_probe_adds_no_synchronisation_on_cuda(run):
    off, on = _syncs(run, "off"), _syncs(run, "on")
    assert [r["step"] for r in run.steps()][-1] == 25  # the probe was on, and saw every step
    assert on == off, (on, off)
