"""Slack: experiment cards as Block Kit messages, their buttons (interactivity) and `/tuneloop` (a slash command).

Every callback is verified with slack-sdk's own `SignatureVerifier` (v0: HMAC-SHA256 over `v0:<timestamp>:<body>`
with the signing secret, a 5-minute window) before its body is read as a payload, and a request seen before (the
same signature or trigger id) is refused. Slack wants an answer within 3 s: the decision is made while the
request is answered (a store write), and what Slack should show afterwards (the card with its outcome, the reject
modal, a refusal only the clicker sees) is posted in the background through `response_url`, `views.open` and
`chat.update`. Outbound calls go through slack-sdk's `WebClient` / `WebhookClient`, only with a bot token.
"""
from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any, Callable
from urllib.parse import parse_qs, urlsplit

from slack_sdk import WebClient
from slack_sdk.signature import SignatureVerifier
from slack_sdk.webhook import WebhookClient

from api.chatops import cards
from api.chatops.common import (Refused, Replays, Unverified, click, command, decided, fresh, may, offered_card,
                                 principal)
from api.service import Service
from api.settings import Settings
from state.approvals import PAST

if TYPE_CHECKING:  # the store is only annotated here
    from state.store import Store

log = logging.getLogger("tuneloop.chatops.slack")
Later = Callable[[], None]  # a follow-up to run once the answer is sent


def verify(settings: Settings, headers: Any, body: bytes) -> str:
    """The request's signature once it is Slack's for this body and recent; Unverified (401/403) otherwise."""
    if settings.slack_signing_secret is None:
        raise Unverified(403, "Slack is not configured here: set TUNELOOP_SLACK_SIGNING_SECRET to accept its callbacks")
    ts = fresh(headers.get("x-slack-request-timestamp"), "X-Slack-Request-Timestamp")
    sig = headers.get("x-slack-signature") or ""
    if not sig.startswith("v0="):
        raise Unverified(401, "X-Slack-Signature: missing or not a v0 signature")
    try:
        body.decode("utf-8")
    except UnicodeDecodeError:
        raise Unverified(401, "body: not UTF-8, so not signed by Slack") from None
    if not SignatureVerifier(settings.slack_signing_secret.get_secret_value()).is_valid(body, str(ts), sig):
        raise Unverified(401, "X-Slack-Signature: does not match the body (another signing secret, or a changed body)")
    return sig


def _form(body: bytes) -> dict[str, str]:
    return {k: v[0] for k, v in parse_qs(body.decode("utf-8"), keep_blank_values=True).items()}


def _first(replays: Replays, sig: str, trigger: Any) -> None:
    if not replays.first(f"slack:sig:{sig}", f"slack:trigger:{trigger}" if trigger else None):
        raise Unverified(403, "replayed request: Slack sent this signature or trigger id before; nothing changed")


class SlackApp:
    """The outbound side: posts cards where the loop asks, updates them with the outcome, opens the reject modal."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        token = settings.slack_bot_token.get_secret_value() if settings.slack_bot_token else None
        self.client = WebClient(token=token, base_url=settings.slack_api_url, timeout=5) if token else None

    def on_event(self, event: str, goal_id: str, text: str, data: dict[str, Any], store: Store) -> bool:
        """A notifier event: a card (or a budget question) when the loop asks for a decision; True when posted."""
        if event != "approval_needed" or self.client is None or not self.settings.slack_channel:
            return False
        if data.get("kind") == "budget_extension":
            line = (f"[tuneloop] goal {goal_id}: {text}. Answer with `/tuneloop {goal_id} extend budget by "
                    f"{data.get('card_hours', 0):g} card-hours` or "
                    f"`/tuneloop {goal_id} refuse the extension because …`")
            self.client.chat_postMessage(channel=self.settings.slack_channel, text=line)
            return True
        if not data.get("candidate_id") or not data.get("card_hash"):
            return False
        v = cards.view(store, int(data["candidate_id"]), str(data["card_hash"]))
        self.client.chat_postMessage(channel=self.settings.slack_channel, text=v.title, blocks=cards.slack_blocks(v))
        return True

    def response_url(self, url: Any) -> str | None:
        """`response_url` when it is Slack's (hooks.slack.com) or on the configured API host; a signed payload
        names it, and still no other host is ever posted to."""
        if not isinstance(url, str):
            return None
        u, api = urlsplit(url), urlsplit(self.settings.slack_api_url)
        if u.scheme == "https" and u.hostname == "hooks.slack.com":
            return url
        return url if (u.scheme, u.netloc) == (api.scheme, api.netloc) else None

    def respond(self, url: str | None, text: str, blocks: list[dict[str, Any]] | None = None,
                replace: bool = False) -> None:
        """Through response_url: replace the card (its outcome) or tell only the clicker (ephemeral)."""
        if url is None:
            log.warning("slack: no usable response_url; the message is not updated")
            return
        if replace:
            WebhookClient(url, timeout=5).send(text=text, blocks=blocks, replace_original=True)
        else:
            WebhookClient(url, timeout=5).send(text=text, response_type="ephemeral", replace_original=False)

    def update(self, channel: str, ts: str, text: str, blocks: list[dict[str, Any]]) -> None:
        if self.client is not None:
            self.client.chat_update(channel=channel, ts=ts, text=text, blocks=blocks)

    def open_modal(self, trigger_id: str, modal: dict[str, Any]) -> None:
        if self.client is not None:
            self.client.views_open(trigger_id=trigger_id, view=modal)


def _safely(what: str, fn: Callable[[], None]) -> Later:
    def run() -> None:
        try:
            fn()
        except Exception as e:  # Slack's error may quote the request: name the call and the error class
            log.warning("slack: %s failed: %s", what, type(e).__name__)
    return run


def _reason(state: Any) -> str | None:
    try:
        value = state["values"][cards.REASON_BLOCK][cards.REASON_ACTION].get("value")
    except (KeyError, TypeError, AttributeError):
        return None
    return value if isinstance(value, str) and value.strip() else None


def interactivity(svc: Service, app: SlackApp, replays: Replays, headers: Any,
                  body: bytes) -> tuple[dict[str, Any] | None, list[Later]]:
    """A verified block_actions / view_submission payload: (the answer's JSON or None, follow-ups)."""
    sig = verify(svc.settings, headers, body)
    try:
        payload = json.loads(_form(body).get("payload", ""))
    except ValueError:
        raise Unverified(400, "payload: not a JSON interaction payload") from None
    if not isinstance(payload, dict):
        raise Unverified(400, "payload: not a JSON object")
    _first(replays, sig, payload.get("trigger_id"))
    kind = payload.get("type")
    if kind == "block_actions":
        return None, _block_actions(svc, app, payload)
    if kind == "view_submission":
        return _view_submission(svc, app, payload)
    return None, []  # shortcuts, closed modals: nothing to do


def _block_actions(svc: Service, app: SlackApp, p: dict[str, Any]) -> list[Later]:
    url = app.response_url(p.get("response_url"))
    action = next((a for a in p.get("actions") or [] if isinstance(a, dict)
                   and a.get("action_id") in (cards.APPROVE, cards.REJECT)), None)
    if action is None:
        return []  # typing into the reason box, or another app's element
    target = cards.parse_value(action.get("value"))
    if target is None:
        return [_safely("respond", lambda: app.respond(url, "not done: this button names no tuneloop card"))]
    cid, shown = target
    decision = "approve" if action["action_id"] == cards.APPROVE else "reject"
    user = (p.get("user") or {}).get("id")
    container = p.get("container") or {}
    channel, ts = (p.get("channel") or {}).get("id") or container.get("channel_id"), container.get("message_ts")
    try:
        who = principal(svc.settings, "slack", user)
        reason = _reason(p.get("state")) if decision == "reject" else None
        if decision == "reject" and reason is None and app.client is not None and p.get("trigger_id"):
            may(who, decision)  # no dialog for someone who may not reject, nor for a decided card
            if (ap := decided(svc, cid)) is not None:
                raise Refused(f"not done: candidate {cid} was already {PAST[ap.decision]} by {ap.who}; "
                              "nothing changed")
            meta = json.dumps({"c": cid, "h": shown, "ch": channel, "ts": ts})
            modal = cards.slack_modal(cards.view(svc.store, cid, shown), meta)  # NotFound: no modal for nothing
            return [_safely("views.open", lambda: app.open_modal(str(p["trigger_id"]), modal))]
        ap = click(svc, "slack", who, cid, shown, decision, reason)
    except Refused as e:
        return _refused(svc, app, url, cid, str(e))
    except LookupError as e:  # NotFound: a card this store never had
        return _refused(svc, app, url, cid, f"not done: {e}")
    out = cards.outcome_text(ap.decision, ap.who, ap.reason, ap.card_hash)
    blocks = cards.slack_blocks(cards.view(svc.store, cid, shown), out)
    return [_safely("respond", lambda: app.respond(url, out, blocks, replace=True))]


def _refused(svc: Service, app: SlackApp, url: str | None, cid: int, why: str) -> list[Later]:
    """Tell the clicker why (ephemeral); a card already decided shows its recorded outcome instead of buttons."""
    later = [_safely("respond", lambda: app.respond(url, why))]
    ap = decided(svc, cid)
    if ap is not None:
        out = cards.outcome_text(ap.decision, ap.who, ap.reason, ap.card_hash)
        blocks = cards.slack_blocks(cards.view(svc.store, cid, ap.card_hash), out)
        later.append(_safely("respond", lambda: app.respond(url, out, blocks, replace=True)))
    return later


def _view_submission(svc: Service, app: SlackApp, p: dict[str, Any]) -> tuple[dict[str, Any] | None, list[Later]]:
    """The reject modal's submit: refused with the reason shown in the modal, else the card is updated."""
    v = p.get("view") or {}
    if v.get("callback_id") != cards.MODAL:
        return None, []
    try:
        meta = json.loads(v.get("private_metadata") or "{}")
        cid, shown = int(meta["c"]), str(meta["h"])
    except (ValueError, KeyError, TypeError):
        return {"response_action": "errors", "errors": {cards.REASON_BLOCK: "not a tuneloop card"}}, []
    try:
        who = principal(svc.settings, "slack", (p.get("user") or {}).get("id"))
        ap = click(svc, "slack", who, cid, shown, "reject", _reason(v.get("state")))
    except (Refused, LookupError) as e:
        return {"response_action": "errors", "errors": {cards.REASON_BLOCK: str(e)[:300]}}, []
    out = cards.outcome_text(ap.decision, ap.who, ap.reason, ap.card_hash)
    blocks = cards.slack_blocks(cards.view(svc.store, cid, shown), out)
    channel, ts = meta.get("ch"), meta.get("ts")
    if isinstance(channel, str) and isinstance(ts, str):
        return None, [_safely("chat.update", lambda: app.update(channel, ts, out, blocks))]
    return None, []


def slash(svc: Service, replays: Replays, headers: Any, body: bytes) -> dict[str, Any] | None:
    """`/tuneloop [goal] <command>`: the REST chat's grammar; a change is announced in the channel, a question, a
    refusal and help only to the one who typed it. Slack's `ssl_check=1` POST (it checks the certificate of a
    slash command URL, unsigned) gets 200 with an empty body, as Slack's slash-command docs ask; it reads nothing."""
    form = _form(body)
    if form.get("ssl_check") == "1" and not form.get("command") and not form.get("text"):
        return None
    sig = verify(svc.settings, headers, body)
    _first(replays, sig, form.get("trigger_id"))
    text = (form.get("text") or "").strip()
    try:
        who = principal(svc.settings, "slack", form.get("user_id"))
    except Refused as e:
        return {"response_type": "ephemeral", "text": str(e)}
    reply, changed = command(svc, "slack", who, text)
    out: dict[str, Any] = {"response_type": "in_channel" if changed else "ephemeral", "text": reply}
    if not changed and (v := offered_card(svc, text)) is not None:  # the command it may have meant, as buttons
        out["blocks"] = [{"type": "section", "text": {"type": "mrkdwn", "text": cards.esc(reply)}},
                         *cards.slack_blocks(v)]
    return out
