"""Helpers of tests/test_chatops.py (no tests here): a real local HTTP server standing in for the Slack Web API,
Slack's response_url and the Feishu/Lark open API; tuneloop itself under uvicorn on a free port; and requests
signed (and, for Feishu, encrypted) exactly as the platforms sign them."""
from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler
from typing import Any, Callable
from urllib.parse import parse_qs, urlencode, urlsplit

import httpx
import uvicorn
from Crypto.Cipher import AES  # pycryptodome, which lark-oapi installs: the platform side of the encryption
from ports_support import free_port
from test_api_support import TOKENS_ENV, reply, serve, wait_until

SLACK_SECRET = "slack-signing-secret-0123456789"
SLACK_TOKEN = "xoxb-slack-bot-token-0123456789"
FEISHU_TOKEN = "feishu-verification-token-0123"
FEISHU_KEY = "feishu-encrypt-key-0123456789"
FEISHU_SECRET = "feishu-app-secret-0123456789"
USERS = ("slack:UALICE:alice:approver,slack:UVERA:vera:viewer,"
         "feishu:ou_fay:fay:approver,feishu:ou_vic:vic:viewer")


class Platform:
    """Slack's Web API (`/api/<method>`), Slack's response_url (`/response/<n>`) and Feishu's open API
    (`/open-apis/...`) on one real HTTP server; it answers as they do and keeps every request."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self.cond = threading.Condition()
        outer = self

        class H(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                u = urlsplit(self.path)
                try:
                    body: Any = json.loads(raw) if raw else {}
                except ValueError:
                    body = {k: v[0] for k, v in parse_qs(raw.decode()).items()}
                call = {"path": u.path, "query": parse_qs(u.query), "headers": dict(self.headers), "body": body}
                with outer.cond:
                    outer.calls.append(call)
                    outer.cond.notify_all()
                answer: Any = {"ok": True}
                if u.path == "/api/chat.postMessage":
                    answer = {"ok": True, "channel": body.get("channel"), "ts": "1700000000.000100"}
                elif u.path == "/open-apis/auth/v3/tenant_access_token/internal":
                    answer = {"code": 0, "msg": "ok", "tenant_access_token": "t-tenant-token", "expire": 7200}
                elif u.path.startswith("/open-apis/"):
                    answer = {"code": 0, "msg": "success", "data": {"message_id": f"om_{len(outer.calls)}"}}
                elif u.path.startswith("/response/"):
                    answer = None
                if answer is None:
                    reply(self, 200, b"ok", "text/plain")
                else:
                    reply(self, 200, json.dumps(answer).encode())

            def log_message(self, *a: object) -> None:
                pass

        self.server = serve(H)
        self.url = f"http://127.0.0.1:{self.server.server_port}"

    def wait(self, pred: Callable[[dict[str, Any]], bool], count: int = 1, timeout: float = 300.0) -> list[dict]:
        """The calls `pred` accepts, once there are `count` of them (the timeout only bounds a hang)."""
        with self.cond:
            ok = self.cond.wait_for(lambda: len([c for c in self.calls if pred(c)]) >= count, timeout)
            assert ok, f"no such call; got {[c['path'] for c in self.calls]}"
            return [c for c in self.calls if pred(c)]

    def to(self, path: str) -> list[dict]:
        with self.cond:
            return [c for c in self.calls if c["path"] == path]

    def close(self) -> None:
        self.server.shutdown()


def env(tmp: Any, platform: Platform, **extra: str) -> dict[str, str]:
    return {"TUNELOOP_TOKENS": TOKENS_ENV, "TUNELOOP_DB": f"sqlite:///{tmp / 't.db'}",
            "TUNELOOP_RUNS_ROOT": str(tmp / "runs"), "TUNELOOP_POLL_S": "0.05",
            "TUNELOOP_SLACK_SIGNING_SECRET": SLACK_SECRET, "TUNELOOP_SLACK_BOT_TOKEN": SLACK_TOKEN,
            "TUNELOOP_SLACK_CHANNEL": "C0TUNING", "TUNELOOP_SLACK_API_URL": f"{platform.url}/api/",
            "TUNELOOP_FEISHU_VERIFICATION_TOKEN": FEISHU_TOKEN, "TUNELOOP_FEISHU_ENCRYPT_KEY": FEISHU_KEY,
            "TUNELOOP_FEISHU_APP_ID": "cli_tuneloop", "TUNELOOP_FEISHU_APP_SECRET": FEISHU_SECRET,
            "TUNELOOP_FEISHU_CHAT_ID": "oc_tuning", "TUNELOOP_FEISHU_DOMAIN": platform.url,
            "TUNELOOP_CHAT_USERS": USERS, **extra}


class Live:
    """The app under uvicorn on a free port, in this process (so a test can read its store)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.url = f"http://127.0.0.1:{free_port()}"
        port = int(self.url.rsplit(":", 1)[1])
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        wait_until(lambda: self.server.started, 120, "uvicorn to start")
        self.http = httpx.Client(base_url=self.url, timeout=60)

    @property
    def store(self) -> Any:
        return self.app.state.service.store

    def close(self) -> None:
        self.http.close()
        self.server.should_exit = True
        self.thread.join(60)


# ---- Slack: v0 signatures and payloads as Slack sends them --------------------------------------------------

def slack_headers(body: bytes, ts: int | None = None, secret: str = SLACK_SECRET) -> dict[str, str]:
    """X-Slack-Signature as Slack computes it: v0=hex(HMAC-SHA256(signing secret, "v0:<ts>:<body>"))."""
    ts = int(time.time()) if ts is None else ts
    mac = hmac.new(secret.encode(), f"v0:{ts}:".encode() + body, hashlib.sha256).hexdigest()
    return {"X-Slack-Request-Timestamp": str(ts), "X-Slack-Signature": f"v0={mac}",
            "Content-Type": "application/x-www-form-urlencoded"}


def block_actions(platform: Platform, user: str, action_id: str, value: str, reason: str | None = None) -> bytes:
    """A block_actions payload (a button click in a message), form-encoded as Slack posts it."""
    p = {"type": "block_actions", "user": {"id": user, "username": user.lower(), "team_id": "T0TEAM"},
         "api_app_id": "A0APP", "team": {"id": "T0TEAM", "domain": "example"},
         "trigger_id": f"{time.time_ns()}.{uuid.uuid4().hex[:12]}", "response_url": f"{platform.url}/response/1",
         "container": {"type": "message", "message_ts": "1700000000.000100", "channel_id": "C0TUNING"},
         "channel": {"id": "C0TUNING", "name": "tuning"},
         "state": {"values": {"tuneloop_reason": {"reason": {"type": "plain_text_input", "value": reason}}}},
         "actions": [{"action_id": action_id, "block_id": "tuneloop_decide", "value": value, "type": "button",
                      "action_ts": f"{time.time():.6f}"}]}
    return urlencode({"payload": json.dumps(p)}).encode()


def view_submission(user: str, metadata: str, reason: str) -> bytes:
    p = {"type": "view_submission", "user": {"id": user}, "team": {"id": "T0TEAM"},
         "trigger_id": f"{time.time_ns()}.{uuid.uuid4().hex[:12]}",
         "view": {"id": "V0VIEW", "type": "modal", "callback_id": "tuneloop_reject", "private_metadata": metadata,
                  "state": {"values": {"tuneloop_reason": {"reason": {"type": "plain_text_input", "value": reason}}}}}}
    return urlencode({"payload": json.dumps(p)}).encode()


def slash(user: str, text: str, platform: Platform) -> bytes:
    return urlencode({"token": "legacy", "team_id": "T0TEAM", "channel_id": "C0TUNING", "user_id": user,
                      "user_name": user.lower(), "command": "/tuneloop", "text": text,
                      "response_url": f"{platform.url}/response/2",
                      "trigger_id": f"{time.time_ns()}.{uuid.uuid4().hex[:12]}"}).encode()


# ---- Feishu: AES-256-CBC bodies and sha256 signatures as Feishu sends them ----------------------------------

def feishu_encrypt(plaintext: bytes, key: str = FEISHU_KEY) -> str:
    """Feishu's encryption: AES-256-CBC keyed with sha256(encrypt key), PKCS#7, base64(iv + ciphertext)."""
    iv = os.urandom(16)
    pad = 16 - len(plaintext) % 16
    ct = AES.new(hashlib.sha256(key.encode()).digest(), AES.MODE_CBC, iv).encrypt(plaintext + bytes([pad]) * pad)
    return base64.b64encode(iv + ct).decode()


def feishu_request(event: dict[str, Any], ts: int | None = None, key: str = FEISHU_KEY,
                   sign_key: str | None = None) -> tuple[bytes, dict[str, str]]:
    """The body ({"encrypt": …}) and headers, X-Lark-Signature = hex(sha256(timestamp + nonce + key + body))."""
    body = json.dumps({"encrypt": feishu_encrypt(json.dumps(event).encode(), key)}).encode()
    ts_s, nonce = str(int(time.time()) if ts is None else ts), uuid.uuid4().hex
    sig = hashlib.sha256((ts_s + nonce + (sign_key or key)).encode() + body).hexdigest()
    return body, {"X-Lark-Request-Timestamp": ts_s, "X-Lark-Request-Nonce": nonce, "X-Lark-Signature": sig,
                  "Content-Type": "application/json"}


def _header(event_type: str, token: str) -> dict[str, Any]:
    return {"event_id": uuid.uuid4().hex, "token": token, "create_time": str(int(time.time() * 1000)),
            "event_type": event_type, "tenant_key": "tenant0", "app_id": "cli_tuneloop"}


def card_click(open_id: str, value: dict[str, Any], reason: str | None = None,
               token: str = FEISHU_TOKEN) -> dict[str, Any]:
    """card.action.trigger (schema 2.0): a submit button of the card's form, with the form's values."""
    return {"schema": "2.0", "header": _header("card.action.trigger", token),
            "event": {"operator": {"tenant_key": "tenant0", "open_id": open_id, "union_id": f"on_{open_id}"},
                      "token": "c-update-token", "host": "im_message",
                      "action": {"tag": "button", "name": value.get("tuneloop"), "value": value,
                                 "form_value": {"reason": reason or ""}},
                      "context": {"open_message_id": "om_1", "open_chat_id": "oc_tuning"}}}


def message_event(open_id: str, text: str) -> dict[str, Any]:
    """im.message.receive_v1: a text message to the bot (the @mention as Feishu writes it, @_user_1)."""
    return {"schema": "2.0", "header": _header("im.message.receive_v1", FEISHU_TOKEN),
            "event": {"sender": {"sender_id": {"open_id": open_id, "union_id": f"on_{open_id}"},
                                 "sender_type": "user", "tenant_key": "tenant0"},
                      "message": {"message_id": f"om_{uuid.uuid4().hex[:8]}", "chat_id": "oc_tuning",
                                  "chat_type": "group", "message_type": "text",
                                  "content": json.dumps({"text": f"@_user_1 {text}"})}}}
