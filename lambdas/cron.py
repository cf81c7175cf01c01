"""A small cron matcher for the eval section's `schedule` (5 fields, UTC).

In `lambdas/` because `eval_dispatch` uses it and only `lambdas/` ships in the Lambda bundle; the
spec imports it to validate `eval.schedule`.

Supports what people write in practice: `*`, numbers, ranges `a-b`, lists `a,b`, steps `*/n` and
`a-b/n`. Day-of-week 0-6 (0 or 7 = Sunday). As in cron, when both day-of-month and day-of-week are
restricted, a day matches if either does. Only `fired_between` is needed: "did the schedule fire
in (start, end]?", which decides whether a committed checkpoint is the first after a firing.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

_FIELDS = (("minute", 0, 59), ("hour", 0, 23), ("day of month", 1, 31), ("month", 1, 12), ("day of week", 0, 7))


@dataclass(frozen=True)
class Cron:
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 = Sunday
    any_day: bool
    any_weekday: bool

    def _day_ok(self, t: datetime) -> bool:
        dom = t.day in self.days
        dow = (t.isoweekday() % 7) in self.weekdays
        if self.any_day or self.any_weekday:
            return dom and dow
        return dom or dow

    def matches(self, t: datetime) -> bool:
        return (t.minute in self.minutes and t.hour in self.hours and t.month in self.months
                and self._day_ok(t))

    def fired_between(self, start: float, end: float) -> bool:
        """Whether some whole minute in (start, end] (UNIX seconds) matches. Skips by month, day
        and hour where they cannot match, so a long window costs little."""
        t = datetime.fromtimestamp(start, timezone.utc).replace(second=0, microsecond=0) + timedelta(minutes=1)
        stop = datetime.fromtimestamp(end, timezone.utc)
        while t <= stop:
            if t.month not in self.months:
                t = (t.replace(day=1, hour=0, minute=0) + timedelta(days=32)).replace(day=1)
            elif not self._day_ok(t):
                t = t.replace(hour=0, minute=0) + timedelta(days=1)
            elif t.hour not in self.hours:
                t = t.replace(minute=0) + timedelta(hours=1)
            elif t.minute not in self.minutes:
                t += timedelta(minutes=1)
            else:
                return True
        return False


def _field(text: str, name: str, lo: int, hi: int) -> frozenset[int]:
    values: set[int] = set()
    for part in text.split(","):
        base, _, step_text = part.partition("/")
        try:
            step = int(step_text) if step_text else 1
            if base == "*":
                a, b = lo, hi
            elif "-" in base:
                a, b = (int(x) for x in base.split("-", 1))
            else:
                a = b = int(base)
                if step_text:
                    b = hi
        except ValueError:
            raise ValueError(f"cron {name}: {part!r} is not a number, range, list or step") from None
        if step < 1 or not (lo <= a <= b <= hi):
            raise ValueError(f"cron {name}: {part!r} is outside {lo}-{hi}")
        values.update(range(a, b + 1, step))
    return frozenset(values)


def parse_cron(text: str) -> Cron:
    parts = text.split()
    if len(parts) != 5:
        raise ValueError(f"cron schedule needs 5 fields (minute hour day month weekday), got {text!r}")
    sets = [_field(p, name, lo, hi) for p, (name, lo, hi) in zip(parts, _FIELDS)]
    weekdays = frozenset(d % 7 for d in sets[4])
    return Cron(sets[0], sets[1], sets[2], sets[3], weekdays, parts[2] == "*", parts[4] == "*")
