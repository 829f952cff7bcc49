"""Optional: an OpenAI-compatible model maps free text onto the chat intents, nothing more.

The model answers with one JSON object validated as `Intent`; anything else is `unknown`.
The same deterministic actions then run (api/actions.py), so the model never acts by itself.
"""
from __future__ import annotations

import json

from pydantic import ValidationError

from api.chat import Intent
from api.settings import Settings

PROMPT = ("Map the user's message about an LLM-serving tuning loop onto exactly one intent. Answer with one JSON "
          "object: {\"kind\": one of approve|reject|pause|resume|stop|one_more_round|restore_best|status|"
          "why_rejected|unknown, \"candidate_id\": int|null, \"reason\": str|null, \"count\": int|null, "
          "\"knobs\": {\"concurrency\"?: int, \"request_rate\"?: number}}. If unsure, kind is unknown.")


def map_intent(text: str, settings: Settings) -> Intent:
    from openai import OpenAI

    client = OpenAI(base_url=settings.llm_base_url, max_retries=1, timeout=20.0,
                    api_key=settings.llm_api_key.get_secret_value() if settings.llm_api_key else "not-needed")
    try:
        r = client.chat.completions.create(model=settings.llm_model, temperature=0,
                                           messages=[{"role": "system", "content": PROMPT},
                                                     {"role": "user", "content": text}])
        raw = json.loads(r.choices[0].message.content or "{}")
        return Intent.model_validate({k: v for k, v in raw.items() if v is not None})
    except (ValidationError, ValueError, AttributeError, IndexError):
        return Intent(kind="unknown")
    except Exception:  # the endpoint is down: the deterministic parser already said unknown
        return Intent(kind="unknown")
