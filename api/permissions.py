"""One permission per action, whichever route or chat command reaches it.

`ACTIONS` is the one table: action -> the least role that may take it. `ROUTES` says which action each
REST operation is (a route that carries several actions, instructions and chat, names them by `kind` /
intent and is let in at the least of their roles, then checks the action itself). The request guard
(api/guard.py) checks the route's role from the token *before* the body is read; the route's dependency
(api/auth.py `require`) and the chat (api/actions.py) check through `check(principal, action)`.
tests/test_api_permissions.py holds the table against the OpenAPI document and every route.
"""
from __future__ import annotations

import re
from functools import lru_cache

from api.settings import ROLE_RANK, Role

ACTIONS: dict[str, Role] = {
    "read": "viewer",  # every GET: goals, candidates, experiments, stations, budget, reports
    "chat.ask": "viewer",  # status, why was N rejected, help
    "goal.create": "admin",
    "goal.pause": "approver",
    "goal.resume": "approver",
    "goal.stop": "approver",
    "goal.one_more_round": "approver",
    "candidate.approve": "approver",
    "candidate.reject": "approver",
    "station.restore": "admin",  # re-deploys a frozen station on a target: the same action on every path
    "budget.extend": "approver",  # grants the extension the loop asked for (card-hours, experiments)
    "budget.refuse": "approver",  # refuses it: the goal stops with the reason
}

# instruction kinds and chat intents -> their action
INSTRUCTIONS: dict[str, str] = {"pause": "goal.pause", "resume": "goal.resume", "stop": "goal.stop",
                                "one_more_round": "goal.one_more_round", "restore": "station.restore"}
CHAT: dict[str, str] = {"status": "chat.ask", "why_rejected": "chat.ask", "unknown": "chat.ask", "refused": "chat.ask",
                        "approve": "candidate.approve", "reject": "candidate.reject", "pause": "goal.pause",
                        "resume": "goal.resume", "stop": "goal.stop", "one_more_round": "goal.one_more_round",
                        "restore_best": "station.restore", "extend_budget": "budget.extend",
                        "refuse_extension": "budget.refuse"}

_READS = ["/goals", "/goals/{goal_id}", "/goals/{goal_id}/instructions", "/goals/{goal_id}/decisions",
          "/goals/{goal_id}/candidates", "/candidates/{candidate_id}", "/candidates/{candidate_id}/approval",
          "/goals/{goal_id}/experiments", "/experiments/{run_id}", "/experiments/{run_id}/phases",
          "/experiments/{run_id}/raw", "/goals/{goal_id}/best", "/goals/{goal_id}/frontier",
          "/goals/{goal_id}/frontier.png", "/goals/{goal_id}/frontier/axes", "/stations/{station_hash}",
          "/goals/{goal_id}/budget",
          "/goals/{goal_id}/report", "/goals/{goal_id}/report.md", "/goals/{goal_id}/images/{name}",
          "/goals/{goal_id}/summary", "/goals/{goal_id}/state", "/goals/{goal_id}/budget/extensions",
          "/goals/{goal_id}/hypotheses", "/goals/{goal_id}/engine-commands"]
# (method, path template) -> an action, or the table of actions the route dispatches on
ROUTES: dict[tuple[str, str], str | dict[str, str]] = {
    **{("GET", p): "read" for p in _READS},
    ("POST", "/goals"): "goal.create",
    ("POST", "/goals/{goal_id}/pause"): "goal.pause",
    ("POST", "/goals/{goal_id}/resume"): "goal.resume",
    ("POST", "/goals/{goal_id}/stop"): "goal.stop",
    ("POST", "/goals/{goal_id}/instructions"): INSTRUCTIONS,
    ("POST", "/goals/{goal_id}/chat"): CHAT,
    ("POST", "/candidates/{candidate_id}/approve"): "candidate.approve",
    ("POST", "/candidates/{candidate_id}/reject"): "candidate.reject",
    ("POST", "/stations/{station_hash}/restore"): "station.restore",
    ("POST", "/goals/{goal_id}/budget/extensions"): "budget.extend",
    ("POST", "/goals/{goal_id}/budget/extensions/refuse"): "budget.refuse",
}
# probes and scrapers; the API's own description (the OpenAPI document, Swagger UI, ReDoc and their static assets)
# is public as well: it names routes and fields, never a goal, a figure or a person (docs/rest-api.md)
PUBLIC: frozenset[tuple[str, str]] = frozenset({("GET", "/health"), ("GET", "/metrics")})


class Forbidden(PermissionError):
    """The principal's role is below the action's (403)."""


def role_of(action: str) -> Role:
    return ACTIONS[action]


def route_role(method: str, path: str) -> Role | None:
    """The least role that may call this operation at all (None: not in the table)."""
    entry = ROUTES.get((method.upper(), path))
    if entry is None:
        return None
    actions = entry.values() if isinstance(entry, dict) else [entry]
    return min((ACTIONS[a] for a in actions), key=ROLE_RANK.__getitem__)


def allowed(role: str, action: str) -> bool:
    return ROLE_RANK[role] >= ROLE_RANK[ACTIONS[action]]


def check(principal: object, action: str) -> None:
    """Raise Forbidden unless the principal (name, role) may take the action."""
    role = getattr(principal, "role")
    if not allowed(role, action):
        raise Forbidden(f"{getattr(principal, 'name')} has role {role}; {action} needs {ACTIONS[action]}")


@lru_cache(maxsize=1)
def _patterns() -> list[tuple[re.Pattern[str], str, str]]:
    out = []
    for method, path in ROUTES:
        rx = re.compile("^" + re.sub(r"\\\{[a-z_]+\\\}", "[^/]+", re.escape(path)) + "$")
        out.append((rx, method, path))
    # a literal segment beats a parameter (`/goals/{id}/report.md` before `/goals/{id}/{anything}`)
    return sorted(out, key=lambda x: x[2].count("{"))


def match(method: str, path: str) -> tuple[str, str] | None:
    """The table's (method, template) for a concrete request path, or None (public, unknown, wrong method)."""
    for rx, m, template in _patterns():
        if m == method.upper() and rx.match(path):
            return m, template
    return None
