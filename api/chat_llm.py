"""Optional: an OpenAI-compatible model maps free text onto the chat intents, nothing more.

Asked only when the deterministic parser says `unknown`. The model answers with one JSON object
validated as `Intent`; anything else (prose, a kind that does not exist, a bad field, an endpoint that
is down) leaves the intent `unknown` with a note saying why, so the reply is the parser's help plus that
note. The same deterministic actions then run (api/actions.py): the model never acts by itself.
"""
from __future__ import annotations

import json
import re
from typing import Any

from pydantic import ValidationError

from api.chat import Intent
from api.settings import Settings

PROMPT = ("Map the user's message about an LLM-serving tuning loop onto exactly one intent. Answer with one JSON "
          "object: {\"kind\": one of approve|reject|pause|resume|stop|one_more_round|restore_best|status|"
          "why_rejected|unknown, \"candidate_id\": int|null, \"reason\": str|null, \"count\": int|null, "
          "\"knobs\": {\"concurrency\"?: int, \"request_rate\"?: number}}. If unsure, kind is unknown.")


def _json_object(text: str) -> dict[str, Any]:
    """The one JSON object of the answer (a ```json fence around it is tolerated); ValueError otherwise."""
    t = text.strip()
    m = re.fullmatch(r"```(?:json)?\s*(.*?)\s*```", t, re.S)
    raw = json.loads(m.group(1) if m else t)
    if not isinstance(raw, dict):
        raise ValueError("the answer is not a JSON object")
    return raw


def map_intent(text: str, settings: Settings) -> tuple[Intent, str | None]:
    """(intent, why it is unknown or None). Never raises: the deterministic parser's answer stands."""
    from openai import OpenAI, OpenAIError  # deferred: openai, only when an LLM endpoint is configured

    client = OpenAI(base_url=settings.llm_base_url, max_retries=1, timeout=20.0,
                    api_key=settings.llm_api_key.get_secret_value() if settings.llm_api_key else "not-needed")
    try:
        r = client.chat.completions.create(model=settings.llm_model, temperature=0,
                                           messages=[{"role": "system", "content": PROMPT},
                                                     {"role": "user", "content": text}])
        answer = r.choices[0].message.content or ""
    except (OpenAIError, IndexError, AttributeError) as e:
        return Intent(kind="unknown"), f"the language model could not be asked ({type(e).__name__})"
    try:
        raw = _json_object(answer)
        intent = Intent.model_validate({k: v for k, v in raw.items() if v is not None})
    except (ValueError, ValidationError):  # ValidationError is a ValueError; named for the reader
        return Intent(kind="unknown"), "the language model's answer was not one of the commands"
    if intent.kind == "unknown":
        return intent, "the language model did not recognise a command either"
    return intent, None
