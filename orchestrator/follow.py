"""What `aerie submit --follow` prints of a job's node logs: every line, but a peer's traceback from
a broken collective is one line.

When one rank fails, every rank it shares a collective with fails a moment later ("Connection
reset by peer", "Connection closed by peer", a NCCL remote error): each prints a 30-line traceback
that names nothing but the collective. They are collateral, not causes, and a reader who sees them
first looks in the wrong place. So a rank's traceback whose exception is a broken collective is
held back, and when the attempt ends its root cause is printed first, then one line per node for
its collateral ranks ("rank 2, 3: collective broken by algo-1's failure"). Any other traceback is
printed whole, as it came; every traceback stays in the node logs (`aerie logs`).

Pure text in, text out: the CLI feeds it what `GET .../logs` returns and asks it for the summary.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

# `[algo-2 rank 3] ` (agent/rank.py), then what the rank printed; torch's own excepthook adds
# `[rank3]: ` before each line of an uncaught exception in a process group.
_RANK_LINE = re.compile(r"^\[(?P<host>[^\s\]]+) rank (?P<rank>\d+)\] (?:\[rank\d+\]: ?)?(?P<body>.*)$")
_TRACEBACK = "Traceback (most recent call last):"
_CHAINED = ("During handling of the above exception", "The above exception was the direct cause")
# The exception of a rank whose peer went away mid-collective: gloo's and NCCL's words for it,
# and c10d's error types for a broken or timed-out process group.
_BROKEN_COLLECTIVE = re.compile(
    r"Connection (?:reset|closed) by peer|Broken pipe|ncclRemoteError|remote process exited|"
    r"DistBackendError|DistNetworkError|NCCL communicator was aborted|ProcessGroupGloo|"
    r"gloo/transport|Socket Timeout",
    re.IGNORECASE,
)


@dataclass
class _Block:
    lines: list[str] = field(default_factory=list)


@dataclass
class LogCondenser:
    """Feeds node-log text through, holding back collateral tracebacks until `attempt_ended`."""

    _partial: dict[str, str] = field(default_factory=dict)  # host -> a line not yet ended
    _open: dict[tuple[str, int], _Block] = field(default_factory=dict)  # a traceback being read
    _collateral: dict[str, set[int]] = field(default_factory=dict)  # host -> ranks
    # Ranks whose collateral exception line was just read: its message may go on over more lines
    # (gloo's `At:` and the frame it names), swallowed with it up to the rank's next plain line.
    _tail: set[tuple[str, int]] = field(default_factory=set)

    def feed(self, host: str, text: str) -> str:
        """What to print now of `text`, the next output of `host`'s log."""
        text = self._partial.pop(host, "") + text
        lines = text.split("\n")
        if lines[-1]:
            self._partial[host] = lines[-1]
        out: list[str] = []
        for line in lines[:-1]:
            out.extend(self._line(line))
        return "".join(f"{line}\n" for line in out)

    def _line(self, line: str) -> Iterable[str]:
        m = _RANK_LINE.match(line)
        if not m:
            return [line]
        key, body = (m["host"], int(m["rank"])), m["body"]
        if key in self._tail:
            if not body.strip() or body[:1].isspace() or body.rstrip() == "At:":
                return []
            self._tail.discard(key)
        block = self._open.get(key)
        if block is None:
            if body.strip() == _TRACEBACK:
                self._open[key] = _Block([line])
                return []
            return [line]
        block.lines.append(line)
        if not body or body[:1].isspace() or body.strip() == _TRACEBACK or body.startswith(_CHAINED):
            return []  # the traceback goes on: frames, source lines, a chained exception
        # The exception line ends it: collateral is held back, anything else printed whole.
        del self._open[key]
        if _BROKEN_COLLECTIVE.search(body):
            self._collateral.setdefault(key[0], set()).add(key[1])
            self._tail.add(key)
            return []
        return block.lines

    def attempt_ended(self, root_host: str | None, root_cause: str | None, logs_hint: str) -> str:
        """The root cause first, then a line per node for its collateral ranks; resets for the next
        attempt. An unfinished traceback is printed as it is."""
        out = [f"root cause: {root_cause}"] if root_cause else []
        by = f"{root_host}'s failure" if root_host else "another rank's failure"
        for host in sorted(self._collateral):
            ranks = ", ".join(str(r) for r in sorted(self._collateral[host]))
            noun = "rank" if len(self._collateral[host]) == 1 else "ranks"
            out.append(f"[{host}] {noun} {ranks}: collective broken by {by} (tracebacks: {logs_hint})")
        for block in self._open.values():
            out.extend(block.lines)
        out.extend(self._partial.values())
        self._open.clear()
        self._collateral.clear()
        self._tail.clear()
        self._partial.clear()
        return "".join(f"{line}\n" for line in out)


def root_cause(job: dict[str, Any], attempt: dict[str, Any]) -> tuple[str | None, str | None]:
    """(host, one line) of what failed `attempt` of `job` (the API's job detail): the node chaining
    blamed, with its own verdict, before the attempt's recorded reason, which is the first report
    that arrived — at a hang, often a peer's "accelerators idle" rather than the cause."""
    blamed = [b for b in job.get("blames") or [] if b.get("attempt_id") == attempt.get("id")]
    if blamed:
        b = blamed[0]
        verdicts = [v for v in job.get("verdicts") or [] if v.get("attempt_id") == attempt.get("id")]
        verdict = next((v for v in verdicts if v.get("host") == b["host"]), None)
        said = f": {verdict['message']}" if verdict else f" ({b.get('rule')}: {b.get('why')})"
        return b["host"], f"{b['kind']} on {b['host']}{said}"
    reason = attempt.get("reason") or {}
    if not reason.get("kind"):
        return None, None
    host = reason.get("host")
    where = f" on {host}" if host else ""
    message = f": {reason['message']}" if reason.get("message") else ""
    return host, f"{reason['kind']}{where}{message}"
