"""On "checkpoint committed": sample the checkpoint's answers and post each one to Slack to be rated.

Triggered by "Aerie Checkpoint Committed" (subscribed in `orchestrator.events.default_subscriptions`,
an EventBridge rule in AWS). In order:
  1. the job's `eval` section decides whether this checkpoint is sampled (every N-th good one, or
     the first after each firing of a cron `schedule`; see `orchestrator.spec.EvalConfig`);
  2. answers come from `python -m trainer.eval_sampler` (torch lives there, not in a Lambda), run
     as a short process beside this handler: fine for the small models an eval loop watches while
     they train; a big model would need a short job on the job's backend instead;
  3. the answers are stored as samples under a (job, checkpoint, prompt) unique key, then each is
     posted with `chat_postMessage` (Block Kit from `lambdas.slack_blocks`).

Idempotent: a redelivered event finds its samples stored (nothing is generated again) and posted
(`slack_ts` set), and posts nothing. A sample is posted only by the delivery that claimed it (an
atomic conditional update in the store); a claim left by a delivery that died mid-post expires
after `LEASE_S`, and whoever takes it over first looks in the channel's history for a message
carrying the sample's id in its metadata before posting, so even that crash window posts once.
Rate limits: the WebClient retries 429s after Retry-After (slack_sdk's RateLimitErrorRetryHandler).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
import urllib.parse
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aerie_contracts import DetailType
from aerie_contracts import env as aerie_env
from aerie_contracts.checkpoints import CheckpointTier
from lambdas import slack_blocks
from lambdas.api import Api
from lambdas.cron import parse_cron
from lambdas.slack_interactions import web_client

if TYPE_CHECKING:
    from slack_sdk import WebClient

log = logging.getLogger("aerie.lambdas.eval_dispatch")

CHECKPOINT_COMMITTED = DetailType.CHECKPOINT_COMMITTED
METADATA_EVENT = "aerie_eval_sample"
LEASE_S = 120.0
MAX_PROMPTS = 50
SAMPLER_TIMEOUT_S = float(os.environ.get(aerie_env.EVAL_SAMPLER_TIMEOUT_S, "900"))
# The sampler's argv (JSON list), e.g. to run it under another interpreter or a scheduler; it
# reads the request as JSON on stdin and prints {"answers": [...]} as its last line.
SAMPLER_COMMAND = aerie_env.EVAL_SAMPLER_COMMAND


class SamplerFailed(RuntimeError):
    pass


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
    base = f"/v1/jobs/{urllib.parse.quote(job['id'])}"
    samples = api.call("GET", f"{base}/eval/samples?checkpoint_uri={urllib.parse.quote(uri, safe='')}")
    if len(samples) < len(prompts):
        if not samples:
            why = not_selected(ev, job, api, uri)
            if why:
                return {"action": "none", "why": why}
        meta = checkpoint_meta(uri, step)
        answers = run_sampler(job["spec"], uri, prompts, ev.get("sampling") or {})
        samples = api.call(
            "POST",
            f"{base}/eval/samples",
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


# --- which checkpoints -----------------------------------------------------------------------------


def not_selected(ev: dict[str, Any], job: dict[str, Any], api: Api, uri: str) -> str | None:
    """None when this checkpoint is to be sampled, else why not. Decided from the store's records
    only (good checkpoints, their commit times, which were sampled), so redeliveries agree."""
    every, schedule = ev.get("every_n_checkpoints"), str(ev.get("schedule") or "")
    if not every and not schedule:
        return None
    # Durable (S3) checkpoints only: a memory checkpoint is never sampled nor counted.
    rows = api.call("GET", f"/v1/jobs/{urllib.parse.quote(job['id'])}/checkpoints")
    checkpoints = sorted(
        (c for c in rows if c["state"] == "good" and c.get("tier", CheckpointTier.S3) == CheckpointTier.S3),
        key=lambda c: c["step"],
    )
    mine = next((c for c in checkpoints if c["uri"] == uri), None)
    if mine is None:
        return "the checkpoint is not (or no longer) good"
    earlier = [c for c in checkpoints if c["step"] < mine["step"]]
    if every:
        n = len(earlier) + 1
        return None if n % int(every) == 0 else f"good checkpoint #{n}, sampling every {every}"
    sampled = {s["checkpoint_uri"] for s in api.call("GET", f"/v1/jobs/{urllib.parse.quote(job['id'])}/eval/samples")}
    previous = [c for c in earlier if c["uri"] in sampled]
    start = previous[-1]["created_at"] if previous else job["created_at"]
    if parse_cron(schedule).fired_between(start, mine["created_at"]):
        return None
    return f"schedule {schedule!r} has not fired since the last sampled checkpoint"


def load_prompts(ev: dict[str, Any], spec: dict[str, Any]) -> list[str]:
    """Inline prompts, then the prompts file's (a JSON list, or one prompt per line)."""
    prompts = list(ev.get("prompts") or [])
    if ev.get("prompts_file"):
        path = Path(ev["prompts_file"]).expanduser()
        if not path.is_absolute():
            path = Path((spec.get("backend_options") or {}).get("workdir") or os.getcwd()) / path
        text = path.read_text()
        if path.suffix == ".json":
            prompts += [str(p) for p in json.loads(text)]
        else:
            prompts += [line for line in text.splitlines() if line.strip()]
    return prompts[:MAX_PROMPTS]


def checkpoint_meta(uri: str, step: int) -> dict[str, Any]:
    """Tokens seen and loss from the checkpoint's manifest (torch-free)."""
    from trainer.checkpoint.manifest import read_manifest

    try:
        manifest = read_manifest(uri) or {}
    except Exception as exc:  # the message shows "-" instead; sampling reads the checkpoint anyway
        log.warning("cannot read the manifest of %s: %s", uri, exc)
        manifest = {}
    return {
        "step": step,
        "tokens": manifest.get("tokens"),
        "loss": (manifest.get("metrics") or {}).get("loss"),
        "committed_at": manifest.get("committed_at"),
    }


def run_sampler(spec: dict[str, Any], uri: str, prompts: list[str], sampling: dict[str, Any]) -> list[str]:
    request = {"checkpoint": uri, "spec": spec, "prompts": prompts, "sampling": sampling}
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "PYTHONWARNINGS": "ignore"}
    repo_root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (repo_root, env.get("PYTHONPATH", "")) if p)
    try:
        proc = subprocess.run(
            sampler_command(),
            input=json.dumps(request),
            capture_output=True,
            text=True,
            timeout=SAMPLER_TIMEOUT_S,
            env=env,
        )
    except subprocess.TimeoutExpired:
        raise SamplerFailed(f"sampling {uri} took over {SAMPLER_TIMEOUT_S:.0f} s") from None
    if proc.returncode != 0:
        raise SamplerFailed(f"sampling {uri} failed ({proc.returncode}): {proc.stderr.strip()[-1500:]}")
    answers: list[str] = json.loads(proc.stdout.strip().splitlines()[-1])["answers"]
    if len(answers) != len(prompts):
        raise SamplerFailed(f"{len(answers)} answers for {len(prompts)} prompts")
    return answers


def sampler_command() -> list[str]:
    raw = os.environ.get(SAMPLER_COMMAND)
    if not raw:
        return [sys.executable, "-m", "trainer.eval_sampler"]
    try:
        argv = json.loads(raw)
    except ValueError:
        argv = None
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        raise SamplerFailed(f"{SAMPLER_COMMAND} must be a JSON list of strings (an argv), got {raw[:200]!r}")
    return argv


# --- posting, once ---------------------------------------------------------------------------------


def post_once(
    api: Api,
    client: WebClient,
    sample: dict[str, Any],
    job: dict[str, Any],
    channel: str,
    raters: int,
    claim: str,
    context: Any,
) -> bool:
    """Post `sample` unless it was posted; True when this call posted it."""
    path = f"/v1/eval/samples/{urllib.parse.quote(sample['id'])}"
    deadline = time.time() + min(LEASE_S + 30, _remaining_s(context))
    while True:
        got = api.call("POST", f"{path}/claim", {"claim": claim, "lease_s": LEASE_S})
        current = got["sample"]
        if current.get("slack_ts"):
            return False
        if got["claimed"]:
            break
        if time.time() > deadline:  # another delivery holds it; the event is retried later
            raise TimeoutError(f"sample {sample['id']} is being posted by another delivery")
        time.sleep(2.0)
    channel = current.get("slack_channel") or channel
    if got["claimed"] == "takeover":
        ts = find_posted(client, channel, current)
        if ts:
            api.call("POST", f"{path}/posted", {"channel": channel, "ts": ts})
            return False
    message = slack_blocks.sample_message(current, job, None, raters)
    resp = client.chat_postMessage(
        channel=channel,
        text=message["text"],
        blocks=message["blocks"],
        metadata={"event_type": METADATA_EVENT, "event_payload": {"sample_id": current["id"]}},
        unfurl_links=False,
        unfurl_media=False,
    )
    api.call("POST", f"{path}/posted", {"channel": resp["channel"], "ts": resp["ts"]})
    return True


def find_posted(client: WebClient, channel: str, sample: dict[str, Any]) -> str | None:
    """The ts of a message already posted for this sample (by a delivery that died before
    recording it), found by the sample id in the message metadata."""
    oldest = str(float(sample.get("created_at") or 0) - 60) if sample.get("created_at") else None
    cursor = None
    while True:
        kwargs: dict[str, Any] = {"channel": channel, "include_all_metadata": True, "limit": 200}
        if oldest:
            kwargs["oldest"] = oldest
        if cursor:
            kwargs["cursor"] = cursor
        resp = client.conversations_history(**kwargs)
        messages: list[dict[str, Any]] = resp.get("messages", [])
        for message in messages:
            meta = message.get("metadata") or {}
            if (
                meta.get("event_type") == METADATA_EVENT
                and (meta.get("event_payload") or {}).get("sample_id") == sample["id"]
            ):
                ts: str = message["ts"]
                return ts
        cursor = (resp.get("response_metadata") or {}).get("next_cursor")
        if not cursor:
            return None


def _remaining_s(context: Any) -> float:
    remaining = getattr(context, "get_remaining_time_in_millis", None)
    return remaining() / 1000.0 - 5 if remaining else LEASE_S
