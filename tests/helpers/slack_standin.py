"""A local stand-in for Slack's Web API, for tests: Slack's servers cannot be reached from here.

It speaks Slack's wire format for the methods Aerie calls, so the real `slack_sdk.WebClient` is
used unchanged, pointed here with `WebClient(base_url=standin.base_url)` (or the
`AERIE_SLACK_API_URL` setting):
  - `chat.postMessage` / `chat.update`: JSON or form bodies, `Authorization: Bearer xoxb-...`,
    answered like Slack (`{"ok": true, "channel": "C...", "ts": "...", "message": {...}}`, or
    `{"ok": false, "error": "invalid_blocks" | "not_authed" | "message_not_found" | ...}`); blocks are
    checked with `lambdas.slack_blocks.validate` (Slack's documented limits);
  - `conversations.history` with `include_all_metadata`, newest first, with message metadata;
  - rate limiting: `rate_limit(n, retry_after)` answers the next n calls with HTTP 429, a
    `Retry-After` header and `{"ok": false, "error": "ratelimited"}`, as Slack does.
Every call is recorded (`calls`), with its arrival time, so tests can check retries and timing.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from lambdas import slack_blocks

BOT_TOKEN = "xoxb-aerie-test-token"


@dataclass
class Call:
    method: str
    args: dict[str, Any]
    t: float
    status: int


@dataclass
class Channel:
    id: str
    messages: dict[str, dict[str, Any]] = field(default_factory=dict)  # ts -> message


class SlackStandIn:
    def __init__(self, token: str = BOT_TOKEN):
        self.token = token
        self.calls: list[Call] = []
        self.channels: dict[str, Channel] = {}
        self._lock = threading.Lock()
        self._limited = 0
        self._retry_after = 1
        self._seq = 0
        standin = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def do_POST(self) -> None:
                standin._handle(self)

            do_GET = do_POST

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_port}/api/"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def env(self) -> dict[str, str]:
        """The variables that point Aerie's WebClient here and let it verify Slack's requests."""
        return {
            "AERIE_SLACK_API_URL": self.base_url,
            "SLACK_BOT_TOKEN": self.token,
            "SLACK_SIGNING_SECRET": SIGNING_SECRET,
        }

    # --- test controls -------------------------------------------------------------------------

    def rate_limit(self, calls: int = 1, retry_after: int = 1) -> None:
        with self._lock:
            self._limited, self._retry_after = calls, retry_after

    def channel_id(self, name: str) -> str:
        """Slack answers with the channel's ID even when posting to `#name`."""
        name = name.lstrip("#")
        if name.startswith("C") and name.isupper():
            return name
        return "C" + hashlib.sha1(name.encode()).hexdigest()[:8].upper()

    def messages(self, channel: str) -> list[dict[str, Any]]:
        ch = self.channels.get(self.channel_id(channel))
        return [] if ch is None else [ch.messages[ts] for ts in sorted(ch.messages)]

    def calls_of(self, method: str) -> list[Call]:
        return [c for c in self.calls if c.method == method]

    def add_message(self, channel: str, message: dict[str, Any]) -> str:
        """Put a message in a channel as if it had been posted (for crash-window tests)."""
        with self._lock:
            ts = self._next_ts()
            ch = self.channels.setdefault(self.channel_id(channel), Channel(self.channel_id(channel)))
            ch.messages[ts] = {"type": "message", "ts": ts, **message}
            return ts

    # --- the wire --------------------------------------------------------------------------------

    def _next_ts(self) -> str:
        self._seq += 1
        return f"{int(time.time())}.{self._seq:06d}"

    def _handle(self, req: BaseHTTPRequestHandler) -> None:
        path = urllib.parse.urlparse(req.path)
        method = path.path.rsplit("/", 1)[-1]
        length = int(req.headers.get("Content-Length") or 0)
        raw = req.rfile.read(length) if length else b""
        args = self._args(req.headers.get("Content-Type", ""), raw, path.query)
        with self._lock:
            if self._limited > 0:
                self._limited -= 1
                self.calls.append(Call(method, args, time.time(), 429))
                return self._send(
                    req, 429, {"ok": False, "error": "ratelimited"}, {"Retry-After": str(self._retry_after)}
                )
            auth = req.headers.get("Authorization", "")
            if auth != f"Bearer {self.token}":
                body = {"ok": False, "error": "not_authed" if not auth else "invalid_auth"}
            else:
                body = self._dispatch(method, args)
            self.calls.append(Call(method, args, time.time(), 200))
        self._send(req, 200, body)

    @staticmethod
    def _args(content_type: str, raw: bytes, query: str) -> dict[str, Any]:
        args: dict[str, Any] = {k: v[0] for k, v in urllib.parse.parse_qs(query).items()}
        if raw and content_type.startswith("application/json"):
            args.update(json.loads(raw))
        elif raw:
            args.update({k: v[0] for k, v in urllib.parse.parse_qs(raw.decode()).items()})
        for key in ("blocks", "metadata"):
            if isinstance(args.get(key), str):
                args[key] = json.loads(args[key])
        return args

    @staticmethod
    def _send(
        req: BaseHTTPRequestHandler, status: int, body: dict[str, Any], headers: dict[str, str] | None = None
    ) -> None:
        data = json.dumps(body).encode()
        req.send_response(status)
        req.send_header("Content-Type", "application/json; charset=utf-8")
        req.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            req.send_header(k, v)
        req.end_headers()
        req.wfile.write(data)

    def _dispatch(self, method: str, args: dict[str, Any]) -> dict[str, Any]:
        if method == "chat.postMessage":
            return self._post(args)
        if method == "chat.update":
            return self._update(args)
        if method == "conversations.history":
            return self._history(args)
        return {"ok": False, "error": "unknown_method"}

    def _message_of(self, args: dict[str, Any]) -> dict[str, Any] | str:
        if not args.get("channel"):
            return "channel_not_found"
        text, blocks = args.get("text"), args.get("blocks")
        if not text and not blocks:
            return "no_text"
        if text is not None and len(text) > slack_blocks.MAX_FALLBACK:
            return "msg_too_long"
        if blocks is not None:
            try:
                slack_blocks.validate(blocks)
            except slack_blocks.InvalidBlocks:
                return "invalid_blocks"
        message = {"type": "message", "text": text or "", "user": "UAERIEBOT", "bot_id": "BAERIE"}
        if blocks is not None:
            message["blocks"] = blocks
        if args.get("metadata"):
            message["metadata"] = args["metadata"]
        return message

    def _post(self, args: dict[str, Any]) -> dict[str, Any]:
        message = self._message_of(args)
        if isinstance(message, str):
            return {"ok": False, "error": message}
        cid = self.channel_id(args["channel"])
        ts = self._next_ts()
        message["ts"] = ts
        self.channels.setdefault(cid, Channel(cid)).messages[ts] = message
        return {"ok": True, "channel": cid, "ts": ts, "message": message}

    def _update(self, args: dict[str, Any]) -> dict[str, Any]:
        ch = self.channels.get(str(args.get("channel")))
        if ch is None:
            return {"ok": False, "error": "channel_not_found"}
        if args.get("ts") not in ch.messages:
            return {"ok": False, "error": "message_not_found"}
        message = self._message_of(args)
        if isinstance(message, str):
            return {"ok": False, "error": message}
        old = ch.messages[args["ts"]]
        message = {**old, **message, "ts": args["ts"], "edited": {"user": "UAERIEBOT", "ts": self._next_ts()}}
        ch.messages[args["ts"]] = message
        return {"ok": True, "channel": ch.id, "ts": args["ts"], "text": message["text"], "message": message}

    def _history(self, args: dict[str, Any]) -> dict[str, Any]:
        ch = self.channels.get(self.channel_id(str(args.get("channel", ""))))
        if ch is None:
            return {"ok": False, "error": "channel_not_found"}
        oldest = float(args.get("oldest") or 0)
        keep_meta = str(args.get("include_all_metadata")).lower() in ("1", "true")
        out = []
        for ts in sorted(ch.messages, reverse=True):
            if float(ts) >= oldest:
                m = dict(ch.messages[ts])
                if not keep_meta:
                    m.pop("metadata", None)
                out.append(m)
        return {"ok": True, "messages": out, "has_more": False, "response_metadata": {"next_cursor": ""}}


# --- what Slack sends to the app's interaction URL -----------------------------------------------

SIGNING_SECRET = "8f742231b10e8888abcd99yyyzzz85a5"  # the format of Slack's documentation example


def block_actions_payload(
    message: dict[str, Any], channel_id: str, user_id: str, action_id: str, user_name: str | None = None
) -> dict[str, Any]:
    """A `block_actions` payload as Slack builds it when `user_id` clicks `action_id` in `message`."""
    button = next(
        el for b in message["blocks"] if b["type"] == "actions" for el in b["elements"] if el["action_id"] == action_id
    )
    block_id = next(b["block_id"] for b in message["blocks"] if b["type"] == "actions" and button in b["elements"])
    now = f"{time.time():.6f}"
    return {
        "type": "block_actions",
        "user": {
            "id": user_id,
            "username": user_name or user_id.lower(),
            "name": user_name or user_id.lower(),
            "team_id": "T0AERIE",
        },
        "api_app_id": "A0AERIE",
        "token": "verification-token-deprecated",
        "container": {"type": "message", "message_ts": message["ts"], "channel_id": channel_id, "is_ephemeral": False},
        "trigger_id": f"{int(time.time())}.1234.abcdef",
        "team": {"id": "T0AERIE", "domain": "aerie"},
        "enterprise": None,
        "is_enterprise_install": False,
        "channel": {"id": channel_id, "name": "eval"},
        "message": message,
        "state": {"values": {}},
        "response_url": f"https://hooks.slack.com/actions/T0AERIE/1/{user_id}",
        "actions": [
            {
                "action_id": action_id,
                "block_id": block_id,
                "text": button["text"],
                "value": button["value"],
                "type": "button",
                "action_ts": now,
                **({"style": button["style"]} if "style" in button else {}),
            }
        ],
    }


def signed_request(
    payload: dict[str, Any] | None,
    secret: str = SIGNING_SECRET,
    timestamp: int | None = None,
    body: bytes | None = None,
) -> tuple[bytes, dict[str, str]]:
    """The form-encoded body and the headers Slack signs it with (v0 HMAC-SHA256)."""
    import hmac

    if body is None:
        body = urllib.parse.urlencode({"payload": json.dumps(payload)}).encode()
    ts = str(int(time.time()) if timestamp is None else timestamp)
    sig = "v0=" + hmac.new(secret.encode(), f"v0:{ts}:".encode() + body, hashlib.sha256).hexdigest()
    return body, {
        "Content-Type": "application/x-www-form-urlencoded",
        "X-Slack-Request-Timestamp": ts,
        "X-Slack-Signature": sig,
    }
