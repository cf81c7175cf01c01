"""Stand-ins for the Supervisor's monitor and reporter, for tests of what it forwards: the test sets
the sample the monitor last took, and reads the metric batches the reporter was handed."""

from __future__ import annotations


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
