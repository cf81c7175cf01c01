"""The lines a FilterLogEvents query searches, in the order its pages go through them.

Events come interleaved across streams in timestamp order (CloudWatch ignores `interleaved: false`
since 2019, and so does this), ties by stream name then position, so one attempt's lines of
algo-1 come before the same attempt's lines of algo-2: the unit of that order is a segment, one
attempt's lines of one stream.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass

from orchestrator import sagemaker_answers as answers
from orchestrator.sagemaker_api.call import Call
from orchestrator.sagemaker_api.log_filter_query import FilterQuery
from orchestrator.sagemaker_api.log_streams import Reader, job_hosts, launched_attempts, stream_name
from orchestrator.store import repo

JOBS_PAGE = 500


@dataclass(frozen=True)
class Segment:
    """One attempt's lines of one stream: the unit events are ordered in (all its lines share its
    timestamp, the attempt's start)."""

    key: tuple[int, str, int]  # (timestamp ms, stream name, attempt number): the order, and a token's anchor
    stream: str
    reader: Reader
    index: int  # the attempt's place in reader.attempts


def search_segments(call: Call, query: FilterQuery) -> list[Segment]:
    """The query's segments, sorted by key: the order pages go in, and what a token points into."""
    out = []
    for record in filter_records(call, query):
        job = record.job
        backend = call.backends.get(job.backend)
        attempts = launched_attempts(job)
        if backend is None or not attempts:
            continue
        for host in job_hosts(job):
            stream = stream_name(record, host)
            if not query.wants(stream):
                continue
            reader = Reader(backend, attempts, host, call.now)
            for index, attempt in enumerate(attempts):
                timestamp = int((attempt.started_at or attempt.created_at) * 1000)
                if query.covers(timestamp):
                    out.append(Segment((timestamp, stream, attempt.number), stream, reader, index))
    out.sort(key=lambda segment: segment.key)
    return out


def filter_records(call: Call, query: FilterQuery) -> Iterator:
    """The tenant's SageMaker jobs in this region whose streams the query may name."""
    if query.names is not None:
        for name in sorted({n.split("/", 1)[0] for n in query.names if "/" in n}):
            arn = answers.training_job_arn(call.region, call.who.tenant, name)
            try:
                yield repo.get_sagemaker_job(call.session, call.who.tenant, arn)
            except repo.NotFound:
                continue
        return
    name = query.prefix.split("/", 1)[0] or None
    offset = 0
    while True:
        page = repo.list_sagemaker_jobs(
            call.session, call.who.tenant, call.region, name_prefix=name, limit=JOBS_PAGE, offset=offset
        )
        yield from page
        if len(page) < JOBS_PAGE:
            return
        offset += JOBS_PAGE


def scan(segments: list[Segment], first: int, offset: int) -> Iterator[tuple[Segment, str, int]]:
    """Every complete line from segment `first` at `offset` on: (segment, line, its offset)."""
    for number, segment in enumerate(segments[first:]):
        before = offset if number == 0 else 0
        for line, after in segment.reader.lines(segment.index, before):
            yield segment, line, before
            before = after


def event_id(key: tuple[int, str, int], offset: int) -> str:
    """A stable id of one line (its stream, attempt and position), in CloudWatch's 56-digit form."""
    digest = hashlib.sha256(f"{key[1]}\0{key[2]}\0{offset}".encode()).digest()
    return str(int.from_bytes(digest, "big")).zfill(78)[:56]
