"""Feishu / Lark: experiment cards as interactive cards (JSON 2.0), their buttons (the `card.action.trigger`
callback) and messages to the bot (`im.message.receive_v1`), through the REST chat's grammar.

Verification is lark-oapi's own (`EventDispatcherHandler`: the AES-256-CBC decryption keyed with sha256(encrypt
key), the verification-token check and the signature sha256(timestamp + nonce + encrypt_key + body) in
X-Lark-Signature), plus what it leaves to the app: a 5-minute window on X-Lark-Request-Timestamp and a replay
check on the event id and signature. A `url_verification` challenge is answered once its token matches. A card
click is answered within Feishu's 3 s with a toast and the card itself (its outcome in place of the buttons); a
message is answered at once and replied to in the background (im.v1 message create, with the app id/secret).

lark-oapi imports its whole API (seconds): it is imported once at startup where Feishu is configured
(`preload`), never in the 3 s of a callback.
"""
from __future__ import annotations

import json
import logging
import re
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Callable

from api.chatops import cards
from api.chatops.common import (Refused, Replays, Unverified, click, command, decided, fresh, offered_card,
                                 principal)
from api.logfilter import SecretFilter
from api.service import Service
from api.settings import Settings
from core.escape import feishu_post

if TYPE_CHECKING:  # the store is only annotated here
    from state.store import Store

log = logging.getLogger("tuneloop.chatops.feishu")
Later = Callable[[], None]
_MENTION = re.compile(r"@_user_\d+|@_all")
_ID = re.compile(r"^[A-Za-z0-9_-]{1,128}$")
_HASH = re.compile(r"^[0-9a-f]{16}$")
TS, NONCE, SIGNATURE = "X-Lark-Request-Timestamp", "X-Lark-Request-Nonce", "X-Lark-Signature"


@lru_cache(maxsize=1)
def _lark() -> Any:
    """lark-oapi, imported once (every name used here is an attribute of the package)."""
    import lark_oapi  # deferred: lark-oapi imports its whole API (seconds), only where Feishu is configured

    return lark_oapi


def preload(settings: Settings) -> None:
    """Import lark-oapi now, and mask this service's secrets in its own log handler (it logs to stdout itself)."""
    _lark()
    for h in logging.getLogger("Lark").handlers:
        h.addFilter(SecretFilter(settings.secrets))


def _handler(encrypt_key: str, token: str) -> Any:
    return _lark().EventDispatcherHandler.builder(encrypt_key, token).build()


def verify(settings: Settings, headers: Any, body: bytes, replays: Replays) -> dict[str, Any]:
    """The event (decrypted) once it is Feishu's for this app; Unverified (401/403) otherwise. A url_verification
    comes back as is (its token checked): the caller echoes the challenge."""
    token = settings.feishu_verification_token.get_secret_value() if settings.feishu_verification_token else ""
    key = settings.feishu_encrypt_key.get_secret_value() if settings.feishu_encrypt_key else ""
    if not token and not key:
        raise Unverified(403, "Feishu/Lark is not configured here: set TUNELOOP_FEISHU_VERIFICATION_TOKEN (and "
                              "TUNELOOP_FEISHU_ENCRYPT_KEY) to accept its callbacks")
    lark = _lark()  # loaded at startup (preload): no wait here
    denied = lark.core.exception.AccessDeniedException
    try:
        outer = json.loads(body)
    except ValueError:
        raise Unverified(400, "body: not JSON") from None
    if not isinstance(outer, dict):
        raise Unverified(400, "body: not a JSON object")
    if key and "encrypt" not in outer:
        raise Unverified(401, "body: not encrypted, but an encrypt key is set (TUNELOOP_FEISHU_ENCRYPT_KEY)")
    if "encrypt" in outer and not key:
        raise Unverified(401, "body: encrypted, but no encrypt key is set (TUNELOOP_FEISHU_ENCRYPT_KEY)")
    handler = _handler(key, token)
    try:
        event = json.loads(handler._decrypt(body, key))  # lark-oapi's AESCipher: AES-256-CBC, sha256(key)
    except Exception:
        raise Unverified(401, "body: cannot be decrypted with the encrypt key (TUNELOOP_FEISHU_ENCRYPT_KEY)") from None
    if not isinstance(event, dict):
        raise Unverified(400, "body: the decrypted event is not a JSON object")
    header = event.get("header") if isinstance(event.get("header"), dict) else {}
    got = header.get("token") if header else event.get("token")
    if token:
        try:
            handler._verify_token(got, token)
        except denied:
            raise Unverified(401, "token: not this app's verification token "
                                  "(TUNELOOP_FEISHU_VERIFICATION_TOKEN)") from None
    if event.get("type") == "url_verification":  # its token checked, or (no token set) decrypted with the key
        return event
    sig = headers.get(SIGNATURE.lower())
    if key:
        fresh(headers.get(TS.lower()), TS)
        if not sig or not headers.get(NONCE.lower()):
            raise Unverified(401, f"{SIGNATURE} / {NONCE}: missing (an encrypt key is set, so Feishu signs)")
        req = lark.core.model.RawRequest()
        req.headers = {TS: headers.get(TS.lower()), NONCE: headers.get(NONCE.lower()), SIGNATURE: sig}
        req.body = body
        try:
            handler._verify_sign(req, key)
        except denied:
            raise Unverified(401, f"{SIGNATURE}: does not match the body (another encrypt key, or a changed "
                                  "body)") from None
    elif headers.get(TS.lower()):
        fresh(headers.get(TS.lower()), TS)
    event_id = header.get("event_id") or event.get("uuid")
    if not event_id and not sig:
        raise Unverified(401, "header.event_id: missing, so a replay could not be told from a new event")
    if not replays.first(f"feishu:event:{event_id}" if event_id else None, f"feishu:sig:{sig}" if sig else None):
        raise Unverified(403, f"replayed request: event {event_id or '(signature)'} was received before; "
                              "nothing changed")
    return event


class FeishuApp:
    """The outbound side (lark-oapi's client, app id and secret): a card where the loop asks, a reply to a message."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._client: Any = None

    @property
    def ready(self) -> bool:
        return bool(self.settings.feishu_app_id and self.settings.feishu_app_secret)

    def client(self) -> Any:
        if self._client is None:
            lark, s = _lark(), self.settings
            assert s.feishu_app_secret is not None
            self._client = (lark.Client.builder().app_id(s.feishu_app_id)
                            .app_secret(s.feishu_app_secret.get_secret_value())
                            .domain(s.feishu_domain).timeout(5).build())
        return self._client

    def send(self, chat_id: str, msg_type: str, content: dict[str, Any]) -> str | None:
        """im.v1 message create in a chat; the new message's id. Raises naming the call and Feishu's code."""
        im = _lark().api.im.v1
        body = (im.CreateMessageRequestBody.builder().receive_id(chat_id).msg_type(msg_type)
                .content(json.dumps(content, ensure_ascii=False)).build())
        resp = self.client().im.v1.message.create(
            im.CreateMessageRequest.builder().receive_id_type("chat_id").request_body(body).build())
        if not resp.success():
            raise RuntimeError(f"im.v1.message.create: Feishu code {resp.code}")
        return resp.data.message_id if resp.data else None

    def on_event(self, event: str, goal_id: str, text: str, data: dict[str, Any], store: Store) -> bool:
        """A notifier event: a card (or a budget question) when the loop asks for a decision; True when posted."""
        chat = self.settings.feishu_chat_id
        if event != "approval_needed" or not self.ready or not chat:
            return False
        if data.get("kind") == "budget_extension":
            self.send(chat, "post", feishu_post(f"[tuneloop] goal {goal_id}: {text}. Answer '{goal_id} extend budget "
                                                f"by {data.get('card_hours', 0):g} card-hours' or '{goal_id} refuse "
                                                f"the extension because …'"))
            return True
        if not data.get("candidate_id") or not data.get("card_hash"):
            return False
        v = cards.view(store, int(data["candidate_id"]), str(data["card_hash"]))
        self.send(chat, "interactive", cards.feishu_card(v))
        return True


def _ids(who: Any) -> tuple[str | None, ...]:
    who = who if isinstance(who, dict) else {}
    return tuple(x if isinstance(x, str) else None for x in (who.get(k) for k in ("open_id", "user_id", "union_id")))


def card_action(svc: Service, event: dict[str, Any]) -> dict[str, Any]:
    """A click on a card's Approve / Reject: the answer Feishu shows (a toast, and the card with its outcome)."""
    ev = event.get("event") if isinstance(event.get("event"), dict) else {}
    action = ev.get("action") if isinstance(ev.get("action"), dict) else {}
    value = action.get("value")
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            value = None
    value = value if isinstance(value, dict) else {}
    decision, cid, shown = value.get("tuneloop"), str(value.get("candidate_id", "")), str(value.get("card_hash", ""))
    if decision not in ("approve", "reject") or not cid.isdigit() or len(cid) > 12 or not _HASH.match(shown):
        return _toast("error", "not done: this button names no tuneloop card")
    form = action.get("form_value") if isinstance(action.get("form_value"), dict) else {}
    reason = form.get(cards.REASON_ACTION) or action.get("input_value")
    try:
        who = principal(svc.settings, "feishu", *_ids(ev.get("operator")))
        ap = click(svc, "feishu", who, int(cid), shown, decision, reason if isinstance(reason, str) else None)
    except (Refused, LookupError) as e:
        why = str(e) if isinstance(e, Refused) else f"not done: {e}"
        done = decided(svc, int(cid))
        if done is None:
            return _toast("error", why)
        was = cards.Decided.of(done.decision, done.who, done.reason, done.card_hash)
        return _toast("error", why) | {"card": {"type": "raw", "data": cards.feishu_card(
            cards.view(svc.store, int(cid), done.card_hash), was)}}
    out = cards.Decided.of(ap.decision, ap.who, ap.reason, ap.card_hash)
    return _toast("success", out.text) | {"card": {"type": "raw", "data": cards.feishu_card(
        cards.view(svc.store, int(cid), shown), out)}}


def _toast(kind: str, text: str) -> dict[str, Any]:
    return {"toast": {"type": kind, "content": text[:500]}}


def message(svc: Service, app: FeishuApp, event: dict[str, Any]) -> list[Later]:
    """A message to the bot: its text through the chat grammar, the reply posted to the same chat afterwards."""
    ev = event.get("event") if isinstance(event.get("event"), dict) else {}
    sender = ev.get("sender") if isinstance(ev.get("sender"), dict) else {}
    msg = ev.get("message") if isinstance(ev.get("message"), dict) else {}
    if sender.get("sender_type") not in (None, "user") or msg.get("message_type") != "text":
        return []  # another bot, an image, a file: nothing to understand
    try:
        text = json.loads(msg.get("content") or "{}").get("text") or ""
    except (ValueError, AttributeError):
        return []
    text = " ".join(_MENTION.sub(" ", str(text)).split())
    try:
        who = principal(svc.settings, "feishu", *_ids(sender.get("sender_id")))
        reply, changed = command(svc, "feishu", who, text)
        offer = None if changed else offered_card(svc, text)  # the command it may have meant, as buttons
    except Refused as e:
        reply, offer = str(e), None
    chat = msg.get("chat_id")
    if not isinstance(chat, str) or not _ID.match(chat):
        return []
    if not app.ready:
        log.warning("feishu: no reply sent: set TUNELOOP_FEISHU_APP_ID and TUNELOOP_FEISHU_APP_SECRET")
        return []

    def send() -> None:
        try:
            app.send(chat, "post", feishu_post(reply))  # plain text: a person's words never mention or link
            if offer is not None:
                app.send(chat, "interactive", cards.feishu_card(offer))
        except Exception as e:  # Feishu's error may quote the request: the error class only
            log.warning("feishu: reply not sent: %s", type(e).__name__)
    return [send]


def handle(svc: Service, app: FeishuApp, replays: Replays, headers: Any,
           body: bytes) -> tuple[dict[str, Any], list[Later]]:
    """One verified POST from Feishu (event subscription or card callback): (the answer, follow-ups)."""
    event = verify(svc.settings, headers, body, replays)
    if event.get("type") == "url_verification":
        return {"challenge": event.get("challenge")}, []
    header = event.get("header") if isinstance(event.get("header"), dict) else {}
    kind = header.get("event_type")
    if kind == "card.action.trigger":
        return card_action(svc, event), []
    if kind == "im.message.receive_v1":
        return {"msg": "success"}, message(svc, app, event)
    return {"msg": f"ignored: event type {str(kind)[:80]!r} is not one tuneloop handles"}, []
