"""What Slack and Feishu/Lark share: who a chat user is, replay detection, a button click turned into a decision,
and a typed command put through the REST chat's own grammar (api/chat.py `parse`, api/actions.py `act`).

A refusal is a `Refused` carrying the sentence the person is shown; it is raised before anything changes.
"""
from __future__ import annotations

import threading
import time
from typing import Any

from api import actions, permissions
from api.chatops import cards
from api.auth import Principal
from api.chat import parse
from api.service import Service
from api.settings import Settings
from state.errors import NotFound, StateError
from state.lifecycle import GoalStatus
from state.reasons import fold, reason_problem

WINDOW_S = 300.0  # a signed request older (or newer) than this is refused: Slack's and our Feishu window
ACTIVE = (GoalStatus.RUNNING, GoalStatus.WAITING, GoalStatus.PAUSED)
PLATFORM = {"slack": "Slack", "feishu": "Feishu/Lark"}


class Refused(Exception):
    """Not done, and why (shown to the person who clicked or typed; nothing changed)."""


class Unverified(Exception):
    """A request that cannot be trusted (signature, timestamp, token, replay): 401 / 403 / 409, never acted on."""

    def __init__(self, status: int, detail: str):
        super().__init__(detail)
        self.status, self.detail = status, detail


def principal(settings: Settings, platform: str, *ids: str | None) -> Principal:
    """The tuneloop identity of a chat user (any of the user's ids may be mapped); Refused when unmapped."""
    known = [i for i in ids if i]
    for u in settings.chat_users:
        if u.platform == platform and u.user in known:
            return Principal(name=u.name, role=u.role)
    shown = known[0] if known else "(no user id)"
    raise Refused(f"not done: {PLATFORM[platform]} user {shown} is not mapped to a tuneloop identity "
                  f"(TUNELOOP_CHAT_USERS); nothing changed")


class Replays:
    """Keys of requests already handled (signatures, trigger / event ids), kept a little longer than the
    timestamp window: a request older than the window is refused by its timestamp anyway. One per API process
    (`tuneloop serve` runs one); a restart forgets them, and the store's one-decision-per-card still holds."""

    def __init__(self, ttl_s: float = 2 * WINDOW_S + 60) -> None:
        self.ttl_s = ttl_s
        self._seen: dict[str, float] = {}
        self._lock = threading.Lock()

    def first(self, *keys: str | None) -> bool:
        """True the first time: records every key; False when any of them was seen (a replay)."""
        keys_ = [k for k in keys if k]
        now = time.monotonic()
        with self._lock:
            self._seen = {k: t for k, t in self._seen.items() if t >= now}  # a few hundred at most
            if any(self._seen.get(k, 0) >= now for k in keys_):
                return False
            for k in keys_:
                self._seen[k] = now + self.ttl_s
            return True


def fresh(timestamp: str | None, what: str, now: float | None = None) -> int:
    """The request's unix timestamp when within the window; Unverified (401) naming the header otherwise."""
    if not timestamp or not timestamp.strip().isdigit() or len(timestamp.strip()) > 12:
        raise Unverified(401, f"{what}: missing or not a unix timestamp")
    ts = int(timestamp.strip())
    age = (time.time() if now is None else now) - ts
    if abs(age) > WINDOW_S:
        raise Unverified(401, f"{what}: timestamp is {abs(age):.0f} s {'old' if age > 0 else 'ahead'}; requests more "
                              f"than {WINDOW_S:.0f} s from now are refused (a replay or a wrong clock)")
    return ts


def may(who: Principal, decision: str) -> None:
    """Refused unless the principal's role may approve / reject (api/permissions.py)."""
    try:
        permissions.check(who, f"candidate.{decision}")
    except PermissionError as e:
        raise Refused(f"not done: {e}; nothing changed") from None


def click(svc: Service, platform: str, who: Principal, candidate_id: int, card_hash: str, decision: str,
          reason: str | None) -> Any:
    """A button: approve or reject exactly the card shown (its hash), recorded `via` the platform. Refused (nothing
    changed) below the role, without a reason to reject, on a changed card (Stale) and on a decided one (Conflict)."""
    may(who, decision)
    said = button_reason(decision, reason)
    try:
        return actions.decide(svc, candidate_id, card_hash, decision, who, said, via=platform)
    except StateError as e:  # Stale, Conflict (already decided, not waiting), NotFound
        raise Refused(f"not done: {e}; nothing changed") from None


def button_reason(decision: str, reason: str | None) -> str | None:
    """The reason typed beside a button as it is stored (folded; None when none was typed for an approval), or
    Refused in the words every channel uses (state/reasons.py)."""
    said = fold(reason) or None
    if (why := reason_problem(said)) is not None and (decision == "reject" or said is not None):
        raise Refused(f"not done: {why} (type a reason, then press Reject); nothing changed")
    return said


def decided(svc: Service, candidate_id: int) -> Any:
    """The recorded decision on a card (after a refusal, to show the message its real state), else None."""
    try:
        return svc.store.approval(candidate_id)
    except StateError:
        return None


def _goal(svc: Service, words: list[str]) -> tuple[str | None, list[str]]:
    """A goal named by the first word (dropped from the command), else (None, words)."""
    if words:
        ids = {g.id for g in svc.store.goals()}
        if words[0] in ids:
            return words[0], words[1:]
    return None, words


def command(svc: Service, platform: str, who: Principal, text: str) -> tuple[str, bool]:
    """A typed command (`/tuneloop approve 12`, a message to the Feishu bot) through the chat grammar: the goal
    is the one named first, else the candidate's, else the only active goal. The reply names what was done or why
    not, and whether something changed; viewers may ask (status, why), acting needs the action's role
    (api/permissions.py)."""
    named, words = _goal(svc, text.split())
    said = " ".join(words)
    intent = parse(said)
    goal_id = named
    if goal_id is None and intent.candidate_id is not None and intent.kind != "refused":
        try:
            goal_id = svc.store.get_candidate(intent.candidate_id).goal_id
        except NotFound:
            return f"not done: no candidate {intent.candidate_id}; nothing changed", False
    if goal_id is None:
        goals = svc.store.goals()
        active = [g.id for g in goals if g.status in ACTIVE]
        if len(active) > 1:
            return ("which goal? name it first, e.g. '" + active[0] + " " + (said or "status") + "'; active goals: "
                    + ", ".join(active)), False
        goal_id = active[0] if active else (goals[-1].id if goals else None)
        if goal_id is None:
            return "there is no goal yet", False
    try:
        reply, done = actions.act(svc, goal_id, intent, who, said=said, via=platform)
    except PermissionError as e:
        return f"not done: {e}; nothing changed", False
    except (StateError, ValueError) as e:  # Stale, Conflict, NotFound, a restore the goal cannot take
        return f"not done: {e}; nothing changed", False
    return reply, done is not None


def offered_card(svc: Service, text: str) -> Any | None:
    """The card a refused message may have meant ("approve 7?", "approve 7 later"), to show with its Approve /
    Reject buttons (bound to the hash the loop showed: a click acts on exactly that card), while the loop waits
    for it; else None. A negated message is offered none (api/chat_near.py)."""
    intent = parse(" ".join(_goal(svc, text.split())[1]))
    meant = (intent.suggest or "").split()
    if intent.kind != "refused" or len(meant) != 2 or meant[0] != "approve":
        return None
    try:
        cand = svc.store.get_candidate(int(meant[1]))
    except NotFound:
        return None
    if cand.id not in {c.id for c in actions.pending(svc, cand.goal_id)}:
        return None
    return cards.view(svc.store, cand.id, actions.shown_hash(svc, cand.id))
