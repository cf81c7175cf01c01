"""Prometheus metrics, read from the store at scrape time (a custom Collector, no in-process counters).

Counting in the store instead of in per-process counters means every replica of the API answers a
scrape with the same numbers, a restart loses nothing, and nothing drifts. Labels are bounded by
construction: states and failure kinds come from aerie_contracts (anything else is `other`),
restart modes and goodput categories are fixed sets, and no label carries a job or attempt id.
Per-job goodput is a histogram over the running jobs, not a series per job.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import case, func, select
from sqlalchemy.orm import Session

from aerie_contracts.failures import FailureKind
from aerie_contracts.goodput import Category, RestartResume
from aerie_contracts.metrics import SAVE_S
from aerie_contracts.restarts import RestartMode, mode_of
from aerie_contracts.states import AttemptState, CheckpointState, JobState
from orchestrator.goodput import advice, ledger, trace
from orchestrator.store.db import Database
from orchestrator.store.models import Attempt, Checkpoint, Job, Node, Verdict

OTHER = "other"
SAVE_BUCKETS = (0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800)
HEARTBEAT_BUCKETS = (0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60)
GOODPUT_BUCKETS = (0.5, 0.7, 0.8, 0.9, 0.95, 0.98, 0.99)


def _json_seconds(s: Session, column: Any, key: str) -> Any:
    """A JSON column's `key` as a number of seconds in SQL, NULL where it is not a non-negative
    number (a CASE: a non-number is never cast, which PostgreSQL would refuse)."""
    if s.get_bind().dialect.name == "postgresql":
        number = func.json_typeof(column[key]) == "number"
    else:
        number = func.json_type(column, f'$."{key}"').in_(["real", "integer"])
    value = column[key].as_float()
    return case((number, case((value >= 0, value), else_=None)), else_=None)


def _bounded(value: str | None, allowed: frozenset[str]) -> str:
    return value if value in allowed else OTHER


def _histogram(name: str, doc: str, values: Iterable[float], buckets: tuple[float, ...]) -> HistogramMetricFamily:
    xs = sorted(values)
    cumulative, i = [], 0
    for b in buckets:
        while i < len(xs) and xs[i] <= b:
            i += 1
        cumulative.append((str(b), i))
    cumulative.append(("+Inf", len(xs)))
    return HistogramMetricFamily(name, doc, buckets=cumulative, sum_value=sum(xs))


class StoreCollector(Collector):
    """The fleet (or one tenant's part of it) as Prometheus metric families."""

    def __init__(self, db: Database, tenant: str | None = None):
        self.db, self.tenant = db, tenant

    def _jobs(self, q):
        return q.where(Job.tenant == self.tenant) if self.tenant is not None else q

    def collect(self) -> Iterator[Metric]:
        with self.db.session() as s:
            yield from self._states(s)
            yield from self._heartbeats(s)
            yield from self._verdicts_and_restarts(s)
            yield from self._checkpoints(s)
            yield from self._goodput(s)

    def _states(self, s: Session) -> Iterator[Metric]:
        jobs = GaugeMetricFamily("aerie_jobs", "Jobs by state.", labels=["state"])
        counts = Counter(
            {
                _bounded(st, JobState.values()): n
                for st, n in s.execute(self._jobs(select(Job.state, func.count()).group_by(Job.state)))
            }
        )
        for st in sorted(JobState.values()):
            jobs.add_metric([st], counts.get(st, 0))
        yield jobs
        attempts = GaugeMetricFamily("aerie_attempts", "Attempts by state.", labels=["state"])
        q = select(Attempt.state, func.count()).join(Job, Attempt.job_id == Job.id).group_by(Attempt.state)
        counts = Counter()
        for st, n in s.execute(self._jobs(q)):
            counts[_bounded(st, AttemptState.values())] += n
        for st in sorted(AttemptState.values()):
            attempts.add_metric([st], counts.get(st, 0))
        yield attempts

    def _heartbeats(self, s: Session) -> Iterator[Metric]:
        """Nodes of running attempts: how many report, how old their newest heartbeat is, and how
        long it took from the agent's clock to the store (its delivery latency)."""
        now = time.time()
        q = (
            select(Node.last_heartbeat_at, Node.summary)
            .join(Attempt, Node.attempt_id == Attempt.id)
            .join(Job, Attempt.job_id == Job.id)
            .where(Attempt.state.in_([AttemptState.RUNNING, AttemptState.STARTING]))
        )
        ages, latencies, reporting = [], [], 0
        for last, summary in s.execute(self._jobs(q)):
            if last is None:
                continue
            reporting += 1
            ages.append(max(0.0, now - last))
            sent = (summary or {}).get("t")
            if isinstance(sent, (int, float)) and not isinstance(sent, bool):
                latencies.append(max(0.0, last - float(sent)))
        yield GaugeMetricFamily(
            "aerie_nodes_reporting", "Nodes of running attempts that have sent a heartbeat.", value=reporting
        )
        yield _histogram(
            "aerie_heartbeat_age_seconds", "Age of each running node's newest heartbeat.", ages, HEARTBEAT_BUCKETS
        )
        yield _histogram(
            "aerie_heartbeat_latency_seconds",
            "Agent send time to store time of each running node's newest heartbeat.",
            latencies,
            HEARTBEAT_BUCKETS,
        )

    def _verdicts_and_restarts(self, s: Session) -> Iterator[Metric]:
        verdicts = CounterMetricFamily("aerie_verdicts", "Verdicts raised by detectors, by kind.", labels=["kind"])
        q = (
            select(Verdict.kind, func.count())
            .join(Attempt, Verdict.attempt_id == Attempt.id)
            .join(Job, Attempt.job_id == Job.id)
            .group_by(Verdict.kind)
        )
        kinds = FailureKind.values()
        counts: Counter[str] = Counter()
        for kind, n in s.execute(self._jobs(q)):
            counts[_bounded(kind, kinds)] += n
        for kind in sorted(counts):
            verdicts.add_metric([kind], counts[kind])
        yield verdicts
        restarts = CounterMetricFamily(
            "aerie_restarts",
            "Attempts after a job's first, by mode (in place or relaunched) and what they resumed from.",
            labels=["mode", "resume"],
        )
        # The mode is in each attempt's `cause` (JSON): read per restart, which are few next to
        # jobs, heartbeats or points; every label pair is always present (a bounded set).
        q = select(Attempt.resume_from.is_not(None), Attempt.cause).join(Job, Attempt.job_id == Job.id)
        by_mode = Counter({(m.value, r.value): 0 for m in RestartMode for r in RestartResume})
        for resumed, cause in s.execute(self._jobs(q.where(Attempt.number > 1))):
            by_mode[(mode_of(cause).value, (RestartResume.CHECKPOINT if resumed else RestartResume.SCRATCH).value)] += 1
        for labels, n in sorted(by_mode.items()):
            restarts.add_metric(list(labels), n)
        yield restarts

    def _checkpoints(self, s: Session) -> Iterator[Metric]:
        """Counted in the database (a row per state, one for the save durations), not row by row."""
        q = (
            select(Checkpoint.state, func.count(), func.coalesce(func.sum(Checkpoint.size_bytes), 0))
            .join(Job, Checkpoint.job_id == Job.id)
            .group_by(Checkpoint.state)
        )
        by_state: Counter[str] = Counter()
        written = 0
        for state, n, size in s.execute(self._jobs(q)):
            by_state[_bounded(state, CheckpointState.values())] += n
            written += int(size or 0)
        states = GaugeMetricFamily("aerie_checkpoints", "Recorded checkpoints by state.", labels=["state"])
        for st in sorted(CheckpointState.values()):
            states.add_metric([st], by_state.get(st, 0))
        yield states
        yield CounterMetricFamily(
            "aerie_checkpoint_written_bytes", "Bytes of every recorded checkpoint (committed saves).", value=written
        )
        save = _json_seconds(s, Checkpoint.meta, SAVE_S)
        q = select(
            func.count(save),
            func.coalesce(func.sum(save), 0.0),
            *(func.sum(case((save <= b, 1), else_=0)) for b in SAVE_BUCKETS),
        ).join(Job, Checkpoint.job_id == Job.id)
        count, total, *cumulative = s.execute(self._jobs(q.select_from(Checkpoint))).one()
        yield HistogramMetricFamily(
            "aerie_checkpoint_save_seconds",
            "Duration of committed saves, begin to commit (includes asynchronous upload).",
            buckets=[*((str(b), int(c or 0)) for b, c in zip(SAVE_BUCKETS, cumulative)), ("+Inf", int(count or 0))],
            sum_value=float(total or 0.0),
        )
        q = select(func.count()).select_from(Attempt).join(Job, Attempt.job_id == Job.id)
        restores = s.scalar(self._jobs(q.where(Attempt.resume_from.is_not(None)))) or 0
        yield CounterMetricFamily("aerie_checkpoint_restores", "Attempts started from a checkpoint.", value=restores)

    def _goodput(self, s: Session) -> Iterator[Metric]:
        """Ledgers of the jobs in progress: node-seconds per category (restore durations among them)
        and a histogram of their goodput ratios; the fleet's MTBF as the advice sees it."""
        running = s.scalars(self._jobs(select(Job).where(Job.state == JobState.IN_PROGRESS))).all()
        totals = {c.value: 0.0 for c in Category}
        ratios = []
        now = time.time()
        for t in trace.read_many(s, running, now):  # a few queries for all of them
            led = ledger.compute(t)
            for cat, v in led["categories"].items():
                totals[cat] += v
            if led["node_seconds"] > 0:
                ratios.append(led["goodput"])
        fam = GaugeMetricFamily(
            "aerie_running_jobs_node_seconds",
            "Node-seconds of the jobs in progress, by goodput category (aerie_contracts.goodput).",
            labels=["category"],
        )
        for cat, v in totals.items():
            fam.add_metric([cat], v)
        yield fam
        yield _histogram(
            "aerie_running_job_goodput_ratio",
            "Goodput (productive / paid node-seconds) of each job in progress.",
            ratios,
            GOODPUT_BUCKETS,
        )
        mtbf, failures, _ = advice.fleet_node_mtbf_s(s, now)
        yield CounterMetricFamily(
            "aerie_infrastructure_failures", "Failed attempts the fleet caused (what MTBF counts).", value=failures
        )
        if mtbf is not None:
            yield GaugeMetricFamily("aerie_node_mtbf_seconds", "Observed mean time between failures per node.", mtbf)
