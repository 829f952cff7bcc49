"""Callbacks of the chat apps: Slack interactivity and `/tuneloop`, Feishu/Lark events and card callbacks.

They exist whether or not a platform is configured, carry no bearer token (the platform signs each request
instead: api/chatops) and are not part of the OpenAPI document of the REST API. What cannot be verified gets
401 / 403 (a replay 403, a body that is not a payload 400) with the reason; a verified request from a person who
may not act is answered 200 with the refusal shown to them (Slack: a message only they see; Feishu: a toast),
so the platform displays it. Nothing here answers 5xx on purpose: the work after the answer (posting the outcome)
runs once it is sent, and its errors are logged, not raised.
"""
from __future__ import annotations

import logging
from typing import Any, Callable

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response
from starlette.background import BackgroundTasks

from api.chatops import attach, feishu, slack
from api.chatops.common import Unverified

log = logging.getLogger("tuneloop.chatops")
router = APIRouter(tags=["chat apps"], include_in_schema=False)


Handler = Callable[[Any, Any, bytes], tuple[Any, list[Callable[[], None]]]]  # (service, chat apps, body)


async def _answer(request: Request, handle: Handler) -> Response:
    """Read the raw body (signatures cover its bytes), handle it off the event loop, answer, then run follow-ups."""
    body = await request.body()
    svc = request.app.state.service
    try:
        out, later = await run_in_threadpool(handle, svc, attach(svc), body)
    except Unverified as e:
        return JSONResponse({"detail": e.detail}, status_code=e.status)
    except Exception as e:  # a payload shaped unlike the platform's, the store briefly gone: said, never a 500
        log.warning("chat app callback %s not handled: %s", request.url.path, type(e).__name__)
        return JSONResponse({"detail": f"not handled ({type(e).__name__}); try again"}, status_code=400)
    tasks = BackgroundTasks()
    for fn in later:
        tasks.add_task(fn)
    if out is None:
        return Response(status_code=200, background=tasks)
    return JSONResponse(out, background=tasks)


@router.post("/chatops/slack/interactivity")
async def slack_interactivity(request: Request) -> Response:
    """Slack's Interactivity Request URL: block_actions (Approve / Reject) and view_submission (the reject modal)."""
    return await _answer(request, lambda svc, apps, body: slack.interactivity(svc, apps.slack, apps.replays,
                                                                             request.headers, body))


@router.post("/chatops/slack/commands")
async def slack_command(request: Request) -> Response:
    """Slack's slash command Request URL: `/tuneloop [goal] approve 12`, `/tuneloop status`, …"""
    return await _answer(request, lambda svc, apps, body: (slack.slash(svc, apps.replays, request.headers, body), []))


@router.post("/chatops/feishu/events")
async def feishu_events(request: Request) -> Response:
    """Feishu/Lark's event subscription Request URL: url_verification and im.message.receive_v1 (a message to the
    bot); a card.action.trigger sent here is handled as on the card URL."""
    return await _answer(request, lambda svc, apps, body: feishu.handle(svc, apps.feishu, apps.replays,
                                                                       request.headers, body))


@router.post("/chatops/feishu/card")
async def feishu_card(request: Request) -> Response:
    """Feishu/Lark's card callback Request URL: card.action.trigger (Approve / Reject on a card)."""
    return await _answer(request, lambda svc, apps, body: feishu.handle(svc, apps.feishu, apps.replays,
                                                                       request.headers, body))
