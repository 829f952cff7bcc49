"""Chat: `POST /goals/{id}/chat` — a command in English or Chinese, answered with ids and figures."""
from __future__ import annotations

from fastapi import APIRouter, HTTPException

from api import actions
from api.auth import Viewer
from api.chat import HELP, command_text, parse
from api.chat_llm import map_intent
from api.deps import ServiceDep
from api.schemas import ChatIn, ChatOut

router = APIRouter(tags=["chat"])
ASKING = ("status", "why_rejected", "unknown", "refused")  # what a model's reading may answer at once: it acts on nothing


@router.post("/goals/{goal_id}/chat", response_model=ChatOut)
def chat(goal_id: str, body: ChatIn, svc: ServiceDep, who: Viewer) -> ChatOut:
    """Viewers may ask (status, why); approve / reject / pause / resume / stop / rounds / restore need approver.
    The deterministic parser answers first; a configured LLM only maps text it did not understand (`via`), and
    what it reads as an action is shown back as the exact command to send, never carried out at once."""
    svc.store.get_goal(goal_id)
    intent, via, note = parse(body.text), "parser", None
    if intent.kind == "unknown" and svc.settings.llm_base_url:

        intent, note = map_intent(body.text, svc.settings)
        via = "llm" if note is None else "parser"
        if via == "llm" and intent.kind not in ASKING:
            # a model's reading acts only once the person confirms it: shown back as the exact command, which
            # (sent as it is) goes through the parser like any other message; nothing is done now
            cmd = command_text(intent)
            if cmd is None or parse(cmd) != intent:
                reply = "I could not turn that into one command I can show you; nothing changed. " + HELP
            else:
                reply = f"I read that as: {cmd!r}. Nothing is done yet: send exactly that to do it."
            return ChatOut(intent=intent.model_dump(mode="json", exclude_defaults=True) | {"kind": intent.kind},
                           reply=reply, action=None, who=who.name, via=via)
    try:
        reply, action = actions.act(svc, goal_id, intent, who, said=body.text)
    except PermissionError as e:
        raise HTTPException(403, str(e)) from None
    if note:
        reply = f"I could not map that onto a command: {note}. {reply}"
    return ChatOut(intent=intent.model_dump(mode="json", exclude_defaults=True) | {"kind": intent.kind},
                   reply=reply, action=action, who=who.name, via=via)
