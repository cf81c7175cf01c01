"""Real processes with the probe injected as `agent.rank` injects it (`agent.inproc.child_env`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent import inproc

REPO = Path(__file__).resolve().parents[3]

# A plain training loop as a user writes it: it prints nothing and knows nothing of Aerie.
TRAIN = """
import os, torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
ckpt = os.environ.get("CKPT")
if ckpt and os.path.exists(ckpt):
    state = torch.load(ckpt)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
x = torch.randn(64, 8)
y = x.sum(1, keepdim=True)
for _ in range(int(os.environ.get("STEPS", "5"))):
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
if ckpt:
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, ckpt)
"""


class Run:
    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.metrics = tmp / "metrics"
        self.ranks = tmp / "agent" / "ranks"

    def env(self, **extra: str) -> dict[str, str]:
        base = {k: v for k, v in os.environ.items() if not k.startswith(("AERIE_", "SM_"))}
        # The probe on, as the agent exports it (`health.probe: on`, the default).
        # Every step its own record (AERIE_PROBE_RECORD_S=0): these loops' steps are microseconds
        # long, and each test reads them one by one (folding has its own test).
        base.update(
            {
                "AERIE_METRICS_PATH": str(self.metrics),
                "AERIE_NODE_DIR": str(self.tmp / "agent"),
                "AERIE_PROBE": "on",
                "AERIE_PROBE_RECORD_S": "0",
            }
        )
        base.update(extra)
        return base

    def script(self, text: str, name: str = "train.py") -> Path:
        path = self.tmp / name
        path.write_text(text)
        return path

    def python(self, argv: list[str], env: dict[str, str] | None = None, inject: bool = True, timeout: float = 60):
        environ = env if env is not None else self.env()
        if inject:
            environ = inproc.child_env(environ)
        return subprocess.run(
            [sys.executable, *argv], env=environ, cwd=self.tmp, capture_output=True, text=True, timeout=timeout
        )

    def records(self, rank: int = 0) -> list[dict]:
        path = self.metrics / f"rank-{rank:05d}.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def steps(self, rank: int = 0) -> list[dict]:
        return [r for r in self.records(rank) if r["event"] is None and r["source"] == "probe"]


@pytest.fixture
def run(tmp_path: Path) -> Run:
    return Run(tmp_path)
