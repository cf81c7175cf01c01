"""On "checkpoint committed": sample the checkpoint's answers and post each one to Slack to be rated.

Triggered by "Aerie Checkpoint Committed" (subscribed in `orchestrator.events.default_subscriptions`,
an EventBridge rule in AWS). In order:
  1. the job's `eval` section decides whether this checkpoint is sampled (every N-th good one, or
     the first after each firing of a cron `schedule`: `lambdas/eval_selection.py`);
  2. answers come from `python -m trainer.eval_sampler`, run as a short process beside this
     handler (`lambdas/eval_sampling.py`);
  3. the answers are stored as samples under a (job, checkpoint, prompt) unique key, then each is
     posted with `chat_postMessage` (Block Kit from `lambdas.slack_blocks`), once
     (`lambdas/eval_posting.py`).

Idempotent: a redelivered event finds its samples stored (nothing is generated again) and posted
(`slack_ts` set), and posts nothing.
"""

from __future__ import annotations

import logging
import urllib.parse
import uuid
from typing import Any

from aerie_contracts import DetailType, routes
from lambdas.api import Api
from lambdas.eval_posting import LEASE_S, post_once
from lambdas.eval_sampling import (
    SAMPLER_TIMEOUT_S,
    SamplerFailed,
    checkpoint_meta,
    load_prompts,
    run_sampler,
    sampler_command,
)
from lambdas.eval_selection import not_selected
from lambdas.slack_interactions import web_client

log = logging.getLogger("aerie.lambdas.eval_dispatch")

CHECKPOINT_COMMITTED = DetailType.CHECKPOINT_COMMITTED
# Re-exported: the dispatcher's timeout is sized from them (orchestrator/events.py), and the
# sampler is named here for whoever rehearses the handler.
__all__ = ["LEASE_S", "SAMPLER_TIMEOUT_S", "SamplerFailed", "handler", "run_sampler", "sampler_command"]


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    if event.get("detail-type") != CHECKPOINT_COMMITTED:
        return {"action": "none", "why": "not a checkpoint commit"}
    detail = event.get("detail") or {}
    api = Api.from_context(context)
    job = api.job(detail["job_id"])
    ev = job["spec"].get("eval") or {}
    channel = ev.get("slack_channel")
    if not channel:
        return {"action": "none", "why": "the job has no eval.slack_channel"}
    prompts = load_prompts(ev, job["spec"])
    if not prompts:
        return {"action": "none", "why": "the job's eval section has no prompts"}
    client = web_client()
    if not client.token:
        raise RuntimeError("eval_dispatch needs a Slack bot token (SLACK_BOT_TOKEN or AERIE_SLACK_BOT_TOKEN)")
    uri, step = detail["uri"], int(detail["step"])
    samples = api.call("GET", f"{routes.job_eval_samples(job['id'])}?checkpoint_uri={urllib.parse.quote(uri, safe='')}")
    if len(samples) < len(prompts):
        if not samples:
            why = not_selected(ev, job, api, uri)
            if why:
                return {"action": "none", "why": why}
        meta = checkpoint_meta(uri, step)
        answers = run_sampler(job["spec"], uri, prompts, ev.get("sampling") or {})
        samples = api.call(
            "POST",
            routes.job_eval_samples(job["id"]),
            {
                "checkpoint_uri": uri,
                "step": step,
                "attempt_id": detail.get("attempt_id"),
                "channel": channel,
                "answers": [
                    {"prompt_index": i, "prompt": p, "answer": a, "meta": meta}
                    for i, (p, a) in enumerate(zip(prompts, answers))
                ],
            },
        )
    raters = int(ev.get("raters_needed") or 3)
    claim = f"{event.get('id', '')[:24]}:{uuid.uuid4().hex[:16]}"
    posted = [s["id"] for s in samples if post_once(api, client, s, job, channel, raters, claim, context)]
    log.info("job %s step %d: %d sample(s), %d posted now", job["id"], step, len(samples), len(posted))
    return {"action": "posted" if posted else "none", "posted": posted, "samples": len(samples), "step": step}
