"""Chat apps: approve or reject experiment cards in Slack and Feishu/Lark, and talk to the loop there.

Outbound, each configured platform is a sink of the service's notifier (api/webhooks.py): when the loop asks for
a decision its card is posted (Slack: bot token + channel; Feishu: app id/secret + chat id). Inbound, the routes of
api/routes/chatops.py exist whether or not anything is configured and refuse what they cannot verify. Setup:
docs/chat-apps.md.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from api.chatops.common import Replays
from api.chatops.feishu import FeishuApp, preload
from api.chatops.slack import SlackApp

if TYPE_CHECKING:  # the store is only annotated here
    from state.store import Store

_LOCK = threading.Lock()


@dataclass
class ChatApps:
    slack: SlackApp
    feishu: FeishuApp
    replays: Replays = field(default_factory=Replays)

    def sinks(self, store: Store, apps: list[Any]) -> list[Callable[[str, str, str, dict[str, Any]], bool]]:
        """Notifier sinks that post the cards of `apps` (those configured to post)."""
        out = []
        for app in apps:
            def sink(event: str, goal_id: str, text: str, data: dict[str, Any], app: Any = app) -> bool:
                return app.on_event(event, goal_id, text, data, store)
            sink.__qualname__ = type(app).__name__
            out.append(sink)
        return out


def attach(svc: Any) -> ChatApps:
    """The service's chat apps (made once): their sinks join the notifier; lark-oapi is imported now where
    Feishu is configured, so no callback waits for it."""
    with _LOCK:
        if svc.chatops is None:
            s = svc.settings
            apps = ChatApps(slack=SlackApp(s), feishu=FeishuApp(s))
            if s.feishu_verification_token or s.feishu_encrypt_key or apps.feishu.ready:
                preload(s)
            posting = [a for a, on in ((apps.slack, s.slack_bot_token and s.slack_channel),
                                       (apps.feishu, apps.feishu.ready and s.feishu_chat_id)) if on]
            svc.notifier.sinks.extend(apps.sinks(svc.store, posting))
            svc.chatops = apps
        return svc.chatops
