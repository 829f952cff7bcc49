"""The planner a session uses, composed in one place (as optuna composes a sampler from its parts): the
deterministic planner or the LLM planner on an OpenAI-compatible endpoint, wrapped by the pre-screen when the
executor can simulate the goal's target on a calibrated profile (agent/planner/prescreen.py)."""
from __future__ import annotations

from dataclasses import dataclass

from agent.planner.deterministic import DeterministicPlanner
from agent.planner.llm import LLMPlanner
from agent.planner.plan import Planner
from agent.planner.prescreen import Prescreened
from core.executor_port import StationSimulator

DEFAULT_LLM_MODEL = "tuneloop-planner"


@dataclass(frozen=True)
class LLMEndpoint:
    """Where the LLM planner asks its model; no base URL: the deterministic planner answers."""

    base_url: str | None = None
    model: str = DEFAULT_LLM_MODEL
    api_key: str | None = None


def build_planner(base: Planner | None = None, *, llm: LLMEndpoint | None = None,
                  simulator: StationSimulator | None = None, target: str = "") -> Planner:
    """`base` where one is given, else the LLM planner on `llm`'s endpoint, else the deterministic planner; screens
    pre-screened when `simulator` (the executor) simulates `target` on a calibrated profile."""
    planner = base
    if planner is None:
        planner = LLMPlanner(llm.base_url, model=llm.model, api_key=llm.api_key or "not-needed") \
            if llm is not None and llm.base_url else DeterministicPlanner()
    if simulator is not None and simulator.calibrated(target):
        planner = Prescreened(planner, simulator)
    return planner
