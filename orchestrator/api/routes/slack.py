"""`POST /v1/slack/interactions`: Slack's request URL for the eval messages' buttons.

Authenticated by Slack's request signature, not by an Aerie bearer token: Slack cannot send one,
and the signing secret (shared only between Slack and this control plane) proves both who sent the
request and that its body is unchanged (see `lambdas.slack_interactions`). The body is read up to
`slack_max_body_bytes` and refused beyond; nothing is parsed before the signature checks out, and
nothing is stored unless every action in the payload is valid.

The rating is committed before the 200 goes back; the message's tally (`chat_update`) and the
TensorBoard scalars are refreshed after the response, since Slack wants an answer within 3 s and
a rate-limited `chat_update` may wait for its Retry-After.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from fastapi import APIRouter, BackgroundTasks, HTTPException, Request, Response
from starlette.concurrency import run_in_threadpool

from lambdas import slack_interactions as slack
from orchestrator.api.routes.ratings import raters_needed, record_and_tally
from orchestrator.settings import Settings
from orchestrator.store import repo
from orchestrator.store.db import Database
from orchestrator.store.models import Job

log = logging.getLogger("aerie.api.slack")
router = APIRouter(tags=["slack"])


def slack_settings() -> Settings:
    return Settings()


async def _read_limited(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise slack.Refused(413, f"body over {limit} bytes")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise slack.Refused(413, f"body over {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _record(db: Database, actions: list[slack.RatingAction]) -> list[dict[str, Any]]:
    """All actions in one transaction: an unknown sample refuses the whole request."""
    results = []
    with db.session() as s:
        for a in actions:
            try:
                sample = repo.get_eval_sample(s, a.sample_id)
            except repo.NotFound:
                raise slack.Refused(400, "the payload names no known sample") from None
            results.append(record_and_tally(s, sample, a.user_id, a.user_name, a.score, a.toggle_hallucination))
    return results


def human_eval_dir(settings: Settings, job_id: str) -> Path:
    """`<jobs>/<job>/tensorboard/human_eval`: beside the attempts' own TensorBoard directories
    (`<jobs>/<job>/attempt-N/<host>/output/tensorboard` on the local backend), so
    `tensorboard --logdir <jobs>/<job>` shows loss and human score together."""
    return settings.jobs_dir / job_id / "tensorboard" / "human_eval"


def write_human_score(db: Database, settings: Settings, job_id: str) -> None:
    from orchestrator import tb_scalars

    def read() -> tb_scalars.Series:
        with db.session() as s:
            job = s.get(Job, job_id)
            rows = repo.ratings_by_checkpoint(s, job, raters_needed(job))
        series = []
        for row in rows:
            values = {}
            if row["mean_score"] is not None:
                values["eval/human_score"] = row["mean_score"]
            if row["hallucination_rate"] is not None:
                values["eval/hallucination_rate"] = row["hallucination_rate"]
            if values:
                series.append((row["step"], values))
        return series

    tb_scalars.write_series(human_eval_dir(settings, job_id), read)


def _after_response(db: Database, settings: Settings, results: list[dict[str, Any]]) -> None:
    token = settings.slack_bot_token.get_secret_value() if settings.slack_bot_token else None
    client = slack.web_client(token=token, base_url=settings.slack_api_url)
    for r in results:
        sample = r["sample"]
        if sample.get("slack_channel") and sample.get("slack_ts"):
            with db.session() as s:  # the tally now, not at request time: clicks may have raced
                tally = repo.tally(repo.ratings_of(s, [sample["id"]]))
            try:
                slack.update_message(
                    client, sample["slack_channel"], sample["slack_ts"], sample, r["job"], tally, r["raters_needed"]
                )
            except Exception as exc:  # the rating is stored; a stale tally is only cosmetic
                log.warning("chat_update of sample %s failed: %s", sample["id"], exc)
    for job_id in {r["job"]["id"] for r in results}:
        try:
            write_human_score(db, settings, job_id)
        except Exception as exc:
            log.warning("writing eval/human_score of %s failed: %s", job_id, exc)


@router.post(
    "/v1/slack/interactions",
    status_code=200,
    response_class=Response,
    responses={
        400: {"description": "malformed payload"},
        401: {"description": "unsigned or stale"},
        413: {"description": "body too large"},
    },
)
async def interactions(request: Request, background: BackgroundTasks) -> Response:
    """Slack's block_actions (rating buttons). Authenticated by X-Slack-Signature, not a token."""
    settings = slack_settings()
    secret = settings.slack_signing_secret.get_secret_value() if settings.slack_signing_secret else ""
    try:
        body = await _read_limited(request, settings.slack_max_body_bytes)
        slack.verify_request(request.headers, body, secret, max_bytes=settings.slack_max_body_bytes)
        actions = slack.parse_actions(body)
        results = await run_in_threadpool(_record, request.app.state.db, actions)
    except slack.Refused as exc:
        log.warning("refused a Slack interaction: %s", exc.reason)
        raise HTTPException(exc.status, exc.reason) from None
    background.add_task(_after_response, request.app.state.db, settings, results)
    return Response(status_code=200)
