"""Parts of a Supervisor for tests of what it does: a node's configuration, and stand-ins for its
monitor and reporter (the test sets the sample the monitor last took, and reads the metric batches
the reporter was handed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agent.config import AgentConfig


def agent_config(
    tmp_path: Path,
    *,
    hosts: tuple[str, ...] = ("algo-1", "algo-2"),
    host: str = "algo-2",
    entrypoint: tuple[str, ...] = ("python", "t.py"),
    **fields: Any,
) -> AgentConfig:
    """A node's configuration given directly, its directories under `tmp_path`: by default the
    second of two hosts; `fields`: AgentConfig's others."""
    return AgentConfig(
        ml_root=tmp_path,
        node_dir=tmp_path / "agent",
        metrics_dir=tmp_path / "m",
        hosts=hosts,
        host=host,
        entrypoint=entrypoint,
        **fields,
    )


class SampleMonitor:
    """A monitor that never fires; the test sets `last_sample`."""

    def __init__(self) -> None:
        self.last_sample: dict = {}

    def tick(self, now):
        return []


class RecordingReporter:
    """Keeps every metrics batch; checkpoints are not its concern."""

    def __init__(self) -> None:
        self.batches: list[list[dict]] = []

    def metrics(self, records):
        self.batches.append(records)

    def checkpoint(self, body):
        pass
