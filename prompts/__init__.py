"""Prompt templates for the LLM planner, kept as files (string.Template, `$name` placeholders)."""
from __future__ import annotations

from importlib import resources
from string import Template


def load(name: str) -> Template:
    """A prompt template by file stem (e.g. "system", "propose")."""
    return Template(resources.files("prompts").joinpath(f"{name}.md").read_text(encoding="utf-8"))


def render(name: str, **values: object) -> str:
    """Fill a template; a missing placeholder is an error (KeyError names it), never silently blank."""
    return load(name).substitute({k: str(v) for k, v in values.items()})
