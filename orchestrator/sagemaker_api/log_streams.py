"""A training job's CloudWatch log streams, as the Logs calls see them: their names and their lines.

SageMaker writes one stream per instance, `<TrainingJobName>/algo-N-<epoch>`. Here each stream is
that host's output across every attempt of the job, one after the other (a restarted job keeps one
stream per host, as SageMaker's do), read through the backend's `logs()` so it works for every
backend. One line is one event; its timestamp is its attempt's start (node logs carry no per-line
clock). Positions are the backend's own offsets (bytes on local and Slurm, events on sagemaker).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from aerie_contracts.states import ATTEMPT_TERMINAL

CHUNK = 256 * 1024
MAX_RESPONSE_BYTES = 1 << 20  # GetLogEvents returns at most 1 MB, as CloudWatch does
TERMINAL = ATTEMPT_TERMINAL


def job_hosts(job) -> list[str]:
    """The job's instances under SageMaker's names, one stream each."""
    count = int(((job.spec or {}).get("resources") or {}).get("instance_count", 1))
    return [f"algo-{i + 1}" for i in range(count)]


def launched_attempts(job) -> list:
    """The attempts with a stream behind them (a handle: their nodes were started), oldest first."""
    return [a for a in sorted(job.attempts, key=lambda a: a.number) if a.handle]


def stream_name(record, host: str) -> str:
    return f"{record.name}/{host}-{int(record.created_at)}"


class Reader:
    """One host's lines across the job's attempts, read through the backend's logs()."""

    def __init__(self, backend, attempts: list, host: str, now: float):
        self.backend = backend
        self.attempts = attempts
        self.host = host
        self.now = now
        # local and Slurm count bytes; the sagemaker backend counts CloudWatch events (lines).
        self.by_lines = getattr(backend, "name", "") == "sagemaker"

    def _read(self, index: int, offset: int, max_bytes: int = CHUNK) -> tuple[str, int]:
        attempt = self.attempts[index]
        try:
            chunk = self.backend.logs(attempt.handle, {self.host: offset}, max_bytes=max_bytes).get(self.host)
        except Exception:
            chunk = None
        return (chunk["text"], int(chunk["offset"])) if chunk else ("", offset)

    def _size(self, line: str) -> int:
        return 1 if self.by_lines else len(line.encode("utf-8")) + 1

    def event(self, index: int, line: str) -> dict[str, Any]:
        a = self.attempts[index]
        return {
            "timestamp": int((a.started_at or a.created_at) * 1000),
            "message": line,
            "ingestionTime": int(self.now * 1000),
        }

    def _keep(self, event: dict[str, Any], body: dict[str, Any]) -> bool:
        start, end = body.get("startTime"), body.get("endTime")
        return (start is None or event["timestamp"] >= start) and (end is None or event["timestamp"] < end)

    def lines(self, index: int, offset: int) -> Iterator[tuple[str, int]]:
        """Attempt `index`'s complete lines from `offset` on, each with the offset after it (the
        same rule as forward(): a running attempt's unfinished last line waits until it is whole)."""
        while True:
            text, _end = self._read(index, offset)
            if not text:
                return
            lines = text.split("\n")
            complete, partial = lines[:-1], lines[-1]
            if partial and self.attempts[index].state in TERMINAL and len(text.encode()) < CHUNK:
                complete.append(partial)
            if not complete:
                return  # only the start of a line still being written
            for line in complete:
                offset += self._size(line)
                yield line, offset

    def forward(self, index: int, offset: int, limit: int, body: dict[str, Any]) -> dict[str, Any]:
        start = (index, offset)
        events: list[dict[str, Any]] = []
        size = 0
        while len(events) < limit and size < MAX_RESPONSE_BYTES:
            text, _end = self._read(index, offset)
            if not text:
                if index + 1 < len(self.attempts):
                    index, offset = index + 1, 0
                    continue
                break
            lines = text.split("\n")
            complete, partial = lines[:-1], lines[-1]
            if partial and self.attempts[index].state in TERMINAL and len(text.encode()) < CHUNK:
                complete.append(partial)  # the attempt is over: its last line will not grow
            taken = 0
            for line in complete:
                if len(events) >= limit:
                    break
                event = self.event(index, line)
                if self._keep(event, body):
                    events.append(event)
                    size += len(line) + 26
                offset += self._size(line)
                taken += 1
            if taken == 0:
                break  # only the start of a line still being written
        return {
            "events": events,
            "nextForwardToken": f"f/{index}/{offset}",
            "nextBackwardToken": f"b/{start[0]}/{start[1]}",
        }

    def backward(self, index: int, offset: int, limit: int, body: dict[str, Any]) -> dict[str, Any]:
        """The lines before a position, within its attempt (enough for paging back a little)."""
        begin = max(0, offset - CHUNK) if not self.by_lines else max(0, offset - limit)
        text, _ = self._read(index, begin, max_bytes=max(offset - begin, 1) if not self.by_lines else CHUNK)
        lines = text.split("\n")
        if not self.by_lines:
            lines = lines[:-1] if text.endswith("\n") else lines
            if begin > 0 and lines:
                begin += self._size(lines[0])  # the first line is cut: start after it
                lines = lines[1:]
        else:
            lines = lines[: offset - begin]
        lines = lines[-limit:]
        first = offset - sum(self._size(line) for line in lines)
        events = [e for e in (self.event(index, line) for line in lines) if self._keep(e, body)]
        return {"events": events, "nextForwardToken": f"f/{index}/{offset}", "nextBackwardToken": f"b/{index}/{first}"}

    def tail(self, limit: int, body: dict[str, Any]) -> dict[str, Any]:
        """Without a token and not from the head: the newest lines (CloudWatch's default)."""
        index = len(self.attempts) - 1
        _, end = self._read(index, -1)
        return self.backward(index, end, limit, body)
