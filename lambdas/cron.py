"""The eval section's `schedule`: a 5-field cron expression (UTC), evaluated with `croniter`.

In `lambdas/` because `eval_dispatch` uses it and only `lambdas/` ships in the Lambda bundle
(croniter, pure Python, ships beside it); the spec imports it to validate `eval.schedule`. The
one question asked is "did the schedule fire in (start, end]?", which decides whether a committed
checkpoint is the first after a firing.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

from croniter import CroniterError, croniter


@dataclass(frozen=True)
class Cron:
    expression: str

    def fired_between(self, start: float, end: float) -> bool:
        """Whether some whole minute in (start, end] (UNIX seconds) matches."""
        nxt: float = croniter(self.expression, datetime.fromtimestamp(start, timezone.utc)).get_next(float)
        return nxt <= end


def parse_cron(text: str) -> Cron:
    """A validated schedule; ValueError naming the problem otherwise."""
    if len(text.split()) != 5:
        raise ValueError(f"cron schedule needs 5 fields (minute hour day month weekday), got {text!r}")
    try:
        croniter(text)
    except (CroniterError, ValueError, KeyError) as exc:
        raise ValueError(f"cron schedule {text!r} is not valid: {exc}") from None
    return Cron(text)
