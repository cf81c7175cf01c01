"""Block Kit for an eval sample: the checkpoint, the prompt, the answer, and the rating buttons.

Every button's `value` is `<sample id>|<what>` (`1`..`5` or `h` for the hallucination toggle), so
an interaction names its sample without any server-side state about messages. `validate` checks a
message against the limits Slack documents for the blocks used here (at most 50 blocks, text of a
section at most 3,000 characters, unique `action_id`s and `block_id`s, ...); the builder runs it on
everything it makes, and the Slack stand-in in the tests runs it on everything it receives.
"""

from __future__ import annotations

from typing import Any

MAX_BLOCKS = 50
MAX_SECTION_TEXT = 3000
MAX_FIELD_TEXT = 2000
MAX_HEADER_TEXT = 150
MAX_BUTTON_TEXT = 75
MAX_VALUE = 2000
MAX_ID = 255
MAX_FALLBACK = 40000

RATE_PREFIX = "rate_"
HALLUCINATION = "hallucination"


def escape(text: str) -> str:
    """mrkdwn needs &, < and > escaped (Slack's rule); code fences inside would end ours early."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("```", "`\u200b``")


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _code_section(block_id: str, title: str, body: str) -> dict[str, Any]:
    head, tail = f"*{title}*\n```", "```"
    room = MAX_SECTION_TEXT - len(head) - len(tail)
    text = escape(body) or " "
    if len(text) > room:
        text = text[: room - 1] + "…"
    return {"type": "section", "block_id": block_id, "text": {"type": "mrkdwn", "text": head + text + tail}}


def tally_text(tally: dict[str, Any] | None, raters_needed: int) -> str:
    if not tally or not tally.get("ratings"):
        return f"No ratings yet · {raters_needed} rater(s) wanted"
    mean = tally.get("mean_score")
    parts = [
        f"{tally['ratings']} rating(s)",
        f"mean *{mean:.2f}*" if mean is not None else "no scores yet",
        f"{tally.get('hallucinations', 0)} hallucination flag(s)",
    ]
    scored = tally.get("scored", 0)
    parts.append("done" if scored >= raters_needed else f"{raters_needed - scored} more wanted")
    return " · ".join(parts)


def sample_message(
    sample: dict[str, Any], job: dict[str, Any], tally: dict[str, Any] | None = None, raters_needed: int = 3
) -> dict[str, Any]:
    """`text` (the notification fallback) and `blocks` of one sample's message."""
    meta = sample.get("meta") or {}
    sid = sample["id"]
    loss = meta.get("loss")
    tokens = meta.get("tokens")
    fields = [
        f"*Job*\n{escape(job.get('name', ''))} (`{escape(job['id'])}`)",
        f"*Step*\n{sample['step']}",
        f"*Tokens seen*\n{tokens:,}" if isinstance(tokens, int) else "*Tokens seen*\n-",
        f"*Loss*\n{loss:.4f}" if isinstance(loss, (int, float)) else "*Loss*\n-",
    ]
    buttons = [
        {
            "type": "button",
            "action_id": f"{RATE_PREFIX}{n}",
            "text": {"type": "plain_text", "text": str(n)},
            "value": f"{sid}|{n}",
        }
        for n in range(1, 6)
    ]
    buttons.append(
        {
            "type": "button",
            "action_id": HALLUCINATION,
            "style": "danger",
            "text": {"type": "plain_text", "text": "Hallucination (toggle)"},
            "value": f"{sid}|h",
        }
    )
    blocks = [
        {
            "type": "header",
            "block_id": "title",
            "text": {
                "type": "plain_text",
                "text": _clip(f"Rate: {job.get('name', job['id'])} @ step {sample['step']}", MAX_HEADER_TEXT),
            },
        },
        {
            "type": "section",
            "block_id": "checkpoint",
            "fields": [{"type": "mrkdwn", "text": _clip(f, MAX_FIELD_TEXT)} for f in fields],
        },
        _code_section("prompt", "Prompt", sample["prompt"]),
        _code_section("answer", "Answer", sample["answer"]),
        {"type": "actions", "block_id": "rate", "elements": buttons},
        {
            "type": "context",
            "block_id": "tally",
            "elements": [{"type": "mrkdwn", "text": _clip(tally_text(tally, raters_needed), MAX_SECTION_TEXT)}],
        },
    ]
    message = {
        "text": _clip(
            f"Eval sample of {job.get('name', job['id'])} at step {sample['step']}: {sample['prompt']}", 3000
        ),
        "blocks": blocks,
    }
    validate(message["blocks"])
    return message


class InvalidBlocks(ValueError):
    """A message Slack would refuse (`invalid_blocks`)."""


def _text(obj: Any, where: str, limit: int, kinds: tuple[str, ...] = ("plain_text", "mrkdwn")) -> None:
    if not isinstance(obj, dict) or obj.get("type") not in kinds or not isinstance(obj.get("text"), str):
        raise InvalidBlocks(f"{where}: must be a text object of type {'/'.join(kinds)}")
    if not obj["text"] or len(obj["text"]) > limit:
        raise InvalidBlocks(f"{where}: text must be 1..{limit} characters, got {len(obj['text'])}")


def validate(blocks: Any) -> None:
    """Raise InvalidBlocks where Slack's documented limits for these block types are broken."""
    if not isinstance(blocks, list) or not 1 <= len(blocks) <= MAX_BLOCKS:
        raise InvalidBlocks(f"a message holds 1..{MAX_BLOCKS} blocks")
    block_ids: set[str] = set()
    action_ids: set[str] = set()
    for i, block in enumerate(blocks):
        where = f"blocks[{i}]"
        if not isinstance(block, dict):
            raise InvalidBlocks(f"{where}: not an object")
        bid = block.get("block_id")
        if bid is not None:
            if not isinstance(bid, str) or not bid or len(bid) > MAX_ID or bid in block_ids:
                raise InvalidBlocks(f"{where}.block_id: must be unique and 1..{MAX_ID} characters")
            block_ids.add(bid)
        kind = block.get("type")
        if kind == "header":
            _text(block.get("text"), f"{where}.text", MAX_HEADER_TEXT, ("plain_text",))
        elif kind == "section":
            if "text" not in block and "fields" not in block:
                raise InvalidBlocks(f"{where}: a section needs text or fields")
            if "text" in block:
                _text(block["text"], f"{where}.text", MAX_SECTION_TEXT)
            fields = block.get("fields", [])
            if not isinstance(fields, list) or len(fields) > 10:
                raise InvalidBlocks(f"{where}.fields: at most 10")
            for j, f in enumerate(fields):
                _text(f, f"{where}.fields[{j}]", MAX_FIELD_TEXT)
        elif kind == "actions":
            elements = block.get("elements")
            if not isinstance(elements, list) or not 1 <= len(elements) <= 25:
                raise InvalidBlocks(f"{where}.elements: 1..25 elements")
            for j, el in enumerate(elements):
                ew = f"{where}.elements[{j}]"
                if not isinstance(el, dict) or el.get("type") != "button":
                    raise InvalidBlocks(f"{ew}: only buttons are used here")
                _text(el.get("text"), f"{ew}.text", MAX_BUTTON_TEXT, ("plain_text",))
                aid = el.get("action_id")
                if not isinstance(aid, str) or not aid or len(aid) > MAX_ID or aid in action_ids:
                    raise InvalidBlocks(f"{ew}.action_id: must be unique in the message and 1..{MAX_ID} characters")
                action_ids.add(aid)
                value = el.get("value", "")
                if not isinstance(value, str) or len(value) > MAX_VALUE:
                    raise InvalidBlocks(f"{ew}.value: at most {MAX_VALUE} characters")
                if el.get("style") not in (None, "primary", "danger"):
                    raise InvalidBlocks(f"{ew}.style: primary or danger")
        elif kind == "context":
            elements = block.get("elements")
            if not isinstance(elements, list) or not 1 <= len(elements) <= 10:
                raise InvalidBlocks(f"{where}.elements: 1..10 elements")
            for j, el in enumerate(elements):
                _text(el, f"{where}.elements[{j}]", MAX_SECTION_TEXT)
        elif kind == "divider":
            pass
        else:
            raise InvalidBlocks(f"{where}: unknown block type {kind!r}")


def parse_value(value: str) -> tuple[str, int | None, bool]:
    """A button's value -> (sample id, score or None, is the hallucination toggle)."""
    sid, sep, what = (value or "").rpartition("|")
    if not sep or not sid.startswith("es_") or len(sid) > 64:
        raise ValueError("button value does not name a sample")
    if what == "h":
        return sid, None, True
    if what in {"1", "2", "3", "4", "5"}:
        return sid, int(what), False
    raise ValueError(f"unknown rating {what!r}")
