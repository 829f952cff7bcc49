"""The permission table (api/permissions.py) against the OpenAPI document and the running app: every
operation has exactly one row, every row is an operation, and each route, instruction kind and chat intent
lets in exactly the roles its action names (in process, no workers)."""
from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from test_api import settings
from test_api_support import auth, small_goal

from api import permissions
from api.app import create_app
from api.chat import IntentKind
from api.schemas import InstructionIn
from api.settings import ROLE_RANK

ROLES = sorted(ROLE_RANK, key=ROLE_RANK.__getitem__)


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("perm")
    with TestClient(create_app(settings(tmp, TUNELOOP_WORKERS="0"))) as c:
        gid = c.post("/goals", json=small_goal(), headers=auth("admin")).json()["id"]
        c.gid = gid  # type: ignore[attr-defined]
        yield c


def operations(client) -> set[tuple[str, str]]:
    spec = client.get("/openapi.json").json()
    return {(m.upper(), path) for path, ops in spec["paths"].items() for m in ops}


def test_every_operation_of_the_openapi_document_has_one_row_and_every_row_is_an_operation(client):
    ops = operations(client)
    assert ops - permissions.PUBLIC == set(permissions.ROUTES)
    assert permissions.PUBLIC <= ops
    spec = client.get("/openapi.json").json()
    for method, path in permissions.ROUTES:  # each says it needs a token, and documents 401 / 403 / 413
        op = spec["paths"][path][method.lower()]
        assert op.get("security") == [{"HTTPBearer": []}], (method, path)
        assert {"401", "403", "413"} <= set(op["responses"]), (method, path)


def test_each_dispatch_table_covers_every_kind_and_intent():
    assert set(permissions.INSTRUCTIONS) == set(InstructionIn.model_fields["kind"].annotation.__args__)
    assert set(permissions.CHAT) == set(IntentKind.__args__)
    for table in (permissions.INSTRUCTIONS, permissions.CHAT, *[a for a in permissions.ROUTES.values()
                                                               if isinstance(a, dict)]):
        assert set(table.values()) <= set(permissions.ACTIONS)


def _url(path: str, gid: str) -> str:
    return path.format(goal_id=gid, candidate_id=1, run_id="r", station_hash="0" * 16, name="p.png")


@pytest.mark.parametrize("method,path", sorted(permissions.ROUTES))
def test_each_route_lets_in_exactly_the_roles_of_the_table(client, method, path):
    need = permissions.route_role(method, path)
    url = _url(path, client.gid)
    assert client.request(method, url, json={}).status_code == 401
    for role in ROLES:
        code = client.request(method, url, json={}, headers=auth(role)).status_code
        if ROLE_RANK[role] < ROLE_RANK[need]:
            assert code == 403, (method, path, role, code)
        else:
            assert code not in (401, 403), (method, path, role, code)


@pytest.mark.parametrize("kind", sorted(permissions.INSTRUCTIONS))
def test_each_instruction_kind_needs_the_role_of_its_action(client, kind):
    need = permissions.role_of(permissions.INSTRUCTIONS[kind])
    body = {"kind": kind} | ({"count": 1} if kind == "one_more_round" else {})
    for role in ROLES:
        r = client.post(f"/goals/{client.gid}/instructions", json=body, headers=auth(role))
        if ROLE_RANK[role] < ROLE_RANK[need] and role == "approver":  # past the route's gate: the action says no
            assert f"{permissions.INSTRUCTIONS[kind]} needs {need}" in r.json()["detail"]
        if ROLE_RANK[role] < ROLE_RANK[need]:
            assert r.status_code == 403, (kind, role, r.text)
        else:
            assert r.status_code not in (401, 403), (kind, role, r.text)


CHAT_TEXT = {"approve": "approve 999", "reject": "reject 999 because no", "pause": "pause", "resume": "resume",
             "stop": "stop", "one_more_round": "one more round at C90", "restore_best": "go back to the best",
             "status": "status", "why_rejected": "why was 999 rejected?", "unknown": "hello there",
             "extend_budget": "extend budget by 10 card-hours", "refuse_extension": "refuse the extension because no",
             "refused": "do not approve 999"}


@pytest.mark.parametrize("intent", sorted(permissions.CHAT))
def test_each_chat_intent_needs_the_role_of_the_same_action_as_its_route(client, intent):
    from api.chat import parse

    text = CHAT_TEXT[intent]
    assert parse(text).kind == intent
    need = permissions.role_of(permissions.CHAT[intent])
    for role in ROLES:
        r = client.post(f"/goals/{client.gid}/chat", json={"text": text}, headers=auth(role))
        if ROLE_RANK[role] < ROLE_RANK[need]:
            assert f"{permissions.CHAT[intent]} needs {need}" in r.json()["detail"]
            assert r.status_code == 403, (intent, role, r.text)
        else:
            assert r.status_code not in (401, 403), (intent, role, r.text)
