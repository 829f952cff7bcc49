"""Bearer tokens with roles (viewer < approver < admin) from the settings; 401 without, 403 below the role.

The principal's *name* is what every action records as "who"; the token itself never leaves this module.
"""
from __future__ import annotations

import hashlib
import hmac
from typing import Annotated, Callable

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, ConfigDict

from api.permissions import route_role
from api.settings import ROLE_RANK, Role, Settings

bearer = HTTPBearer(auto_error=False, description="API token (roles: viewer, approver, admin)")


class Principal(BaseModel):
    model_config = ConfigDict(frozen=True)
    name: str
    role: Role


class TokenTable:
    """Token digests -> principals; lookups compare digests in constant time."""

    def __init__(self, settings: Settings):
        self._rows = [(hashlib.sha256(t.token.get_secret_value().encode()).digest(), Principal(name=t.name, role=t.role))
                      for t in settings.tokens]

    def lookup(self, token: str) -> Principal | None:
        d = hashlib.sha256(token.encode()).digest()
        found = None
        for digest, p in self._rows:
            if hmac.compare_digest(digest, d):
                found = p
        return found


def _principal(request: Request, creds: HTTPAuthorizationCredentials | None) -> Principal:
    if creds is None or not creds.credentials:
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, "authentication required: send 'Authorization: Bearer <token>'",
                            headers={"WWW-Authenticate": "Bearer"})
    p = request.app.state.service.tokens.lookup(creds.credentials)
    if p is None:
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, "unknown or revoked token", headers={"WWW-Authenticate": "Bearer"})
    return p


def require(role: Role) -> Callable[..., Principal]:
    """The caller, let in at the role the permission table (api/permissions.py) gives this route; `role` is
    what the route declares and only stands in for a route the table does not list (a test fails for it)."""
    def dep(request: Request, creds: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]) -> Principal:

        p = _principal(request, creds)
        route = request.scope.get("route")
        need = route_role(request.method, getattr(route, "path", "")) or role
        if ROLE_RANK[p.role] < ROLE_RANK[need]:
            raise HTTPException(status.HTTP_403_FORBIDDEN, f"{p.name} has role {p.role}; this needs {need}")
        return p

    dep.__name__ = f"require_{role}"
    return dep


Viewer = Annotated[Principal, Depends(require("viewer"))]
Approver = Annotated[Principal, Depends(require("approver"))]
Admin = Annotated[Principal, Depends(require("admin"))]
