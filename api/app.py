"""The FastAPI app: routers, error mapping (404 / 409 / 422 with field names), request metrics, workers."""
from __future__ import annotations

from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from fastapi_offline import FastAPIOffline

from api.asgi import HttpMiddleware
from api.guard import RequestGuard
from api.pageheaders import PageHeaders
from api.readcache import ReadCache
from api.chatops import attach as chatops_attach
from api.routes import budget, candidates, chat, chatops, commands, experiments, goals, health, reports, stations
from api.service import Service
from api.settings import Settings
from core.bounded import excerpt
from core.errors import FieldError
from state.errors import Conflict, GoalError, InvalidTransition, NotFound, Stale, StaleEpoch
from state.goal import GoalSpec

DASHBOARD = Path(__file__).with_name("dashboard") / "index.html"
REASON_CHARS = 2000  # the most of one field's reason a 422 carries (state/goal.py cuts a value it repeats to 400)
# the dashboard's tab icon: a tuning dial (a ring and a needle), served at /favicon.ico
FAVICON = ('<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 32 32"><circle cx="16" cy="16" r="13" fill="#fff" '
           'stroke="#1f77b4" stroke-width="4"/><path d="M16 16 L24 8" stroke="#e0a000" stroke-width="4" '
           'stroke-linecap="round"/></svg>')
_ERR = {"content": {"application/json": {"schema": {"type": "object", "properties": {"detail": {}}}}}}
# what every authenticated operation may answer besides its own responses (documented, so a client and a
# schema checker know every status code the server sends)
GUARDED: dict[int | str, dict[str, Any]] = {
    400: {"description": "the request cannot be parsed (a body that is not JSON)", **_ERR},
    401: {"description": "no token, or an unknown one", **_ERR},
    403: {"description": "the token's role is below the action's (api/permissions.py)", **_ERR},
    404: {"description": "no such goal, candidate, experiment or station", **_ERR},
    409: {"description": "the state does not allow it now (already decided, stale card, identical goal "
                         "running, invalid transition)", **_ERR},
    413: {"description": "request body larger than max_body_bytes (refused before it is read)", **_ERR},
    422: {"description": "invalid input; each error names its field and the reason", **_ERR},
}
PUBLIC_RESPONSES: dict[int | str, dict[str, Any]] = {413: GUARDED[413]}


def create_app(settings: Settings | None = None, *, start_workers: bool = True,
               service: Service | None = None) -> FastAPI:
    """The app; it opens its own Service on startup unless one is given (then it is also usable without
    a lifespan, e.g. by an in-process schema fuzzer)."""
    settings = service.settings if service is not None else (settings or Settings.from_env())

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if service is not None:
            yield
            return
        svc = Service.open(settings)
        chatops_attach(svc)  # Slack / Feishu cards where the loop asks (docs/chat-apps.md)
        app.state.service = svc
        if start_workers:
            svc.start_workers()
        try:
            yield
        finally:
            svc.close()

    # Swagger UI and ReDoc from the installed package (fastapi-offline), not a CDN: /docs works on a cluster's
    # management network that reaches no internet
    app = FastAPIOffline(title="tuneloop", version="0.1.0", lifespan=lifespan,
                  description="Closed-loop tuning of LLM inference deployments: goals, approvals, experiments, "
                              "stations, chat. Auth: `Authorization: Bearer <token>` (viewer < approver < admin).")
    for r in (goals, candidates, experiments, stations, commands, budget, reports, chat):
        app.include_router(r.router, responses=GUARDED)
    app.include_router(health.router, responses=PUBLIC_RESPONSES)
    app.include_router(chatops.router)  # Slack / Feishu callbacks: signed by the platform, no bearer token
    _errors(app)
    if service is not None:
        app.state.service = service

    app.add_middleware(ReadCache)  # innermost: counted and guarded like any answer
    app.add_middleware(CountRequests)
    app.add_middleware(RequestGuard)  # size limit and token before any body is read
    app.add_middleware(PageHeaders)  # outermost: nosniff on every answer, a CSP and no framing on every page
    _goal_schema(app)

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    def dashboard() -> str:
        return DASHBOARD.read_text(encoding="utf-8")

    @app.get("/favicon.ico", include_in_schema=False)
    def favicon() -> Response:
        """The tab's icon (a browser asks for it on every page): an inline SVG, public like the page itself."""
        return Response(FAVICON, media_type="image/svg+xml", headers={"Cache-Control": "max-age=86400"})

    return app


class CountRequests(HttpMiddleware):
    """The request counter of /metrics by route template, method and status (plain ASGI: no per-request task)."""

    async def http(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        status = 500

        async def sent(msg: dict[str, Any]) -> None:
            nonlocal status
            if msg["type"] == "http.response.start":
                status = msg["status"]
            await send(msg)

        try:
            await self.app(scope, receive, sent)
        finally:
            route = scope.get("route")
            health.REQUESTS.labels(getattr(route, "path", "other"), scope["method"], str(status)).inc()


def _goal_schema(app: FastAPI) -> None:
    """`POST /goals` reads JSON or YAML itself; its body schema is state.goal.GoalSpec, put in the components."""

    plain = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            doc = plain()
            spec = GoalSpec.model_json_schema(ref_template="#/components/schemas/{model}")
            comps = doc.setdefault("components", {}).setdefault("schemas", {})
            for name, sub in spec.pop("$defs", {}).items():
                comps.setdefault(name, sub)
            comps["GoalSpec"] = spec
            app.openapi_schema = doc
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


MAX_ERRORS = 50  # field errors a 422 lists (a body with thousands of bad fields gets the first fifty)


def _errors(app: FastAPI) -> None:
    def err(code: int) -> Any:
        async def handler(request: Request, exc: Exception) -> JSONResponse:
            return JSONResponse({"detail": str(exc)}, status_code=code)
        return handler

    async def goal_error(request: Request, exc: GoalError) -> JSONResponse:
        """Each field's reason as the goal's validation worded it (already cut where it could repeat a value; a data
        file's error kept whole, its known names listed): at most REASON_CHARS of it, a safety net."""
        return JSONResponse({"detail": [{"loc": ["body", *field.split(".")], "msg": excerpt(reason, REASON_CHARS),
                                         "type": "value_error"} for field, reason in exc.errors[:MAX_ERRORS]]},
                            status_code=422)

    async def value_error(request: Request, exc: ValueError) -> JSONResponse:
        """A refused value: a FieldError's field is its `loc` under the body; any other ValueError is the body's."""
        loc, msg = (["body", *excerpt(exc.field, 200).split(".")], exc.reason) if isinstance(exc, FieldError) \
            else (["body"], str(exc))
        return JSONResponse({"detail": [{"loc": loc, "msg": excerpt(msg, 400), "type": "value_error"}]},
                            status_code=422)

    async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        """FastAPI's 422, with what it repeats of the input cut to an excerpt (a reply never echoes a body)."""
        out = []
        for e in exc.errors()[:MAX_ERRORS]:
            item = {k: e[k] for k in ("loc", "msg", "type") if k in e}
            item["loc"] = [x if isinstance(x, int) else excerpt(str(x), 80) for x in item.get("loc", ())]
            item["msg"] = excerpt(str(item.get("msg", "")), 400)
            if "input" in e:
                item["input"] = e["input"] if isinstance(e["input"], (int, float, bool, type(None))) \
                    else excerpt(e["input"])
            out.append(item)
        return JSONResponse({"detail": out}, status_code=422)

    app.add_exception_handler(RequestValidationError, invalid_request)  # type: ignore[arg-type]
    app.add_exception_handler(GoalError, goal_error)  # type: ignore[arg-type]
    app.add_exception_handler(NotFound, err(404))
    app.add_exception_handler(Stale, err(409))
    app.add_exception_handler(Conflict, err(409))
    app.add_exception_handler(InvalidTransition, err(409))
    app.add_exception_handler(StaleEpoch, err(409))
    app.add_exception_handler(ValueError, value_error)  # type: ignore[arg-type]
    app.add_exception_handler(PermissionError, err(403))  # api.permissions.Forbidden
