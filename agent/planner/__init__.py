"""The planner's reasoning, pure: the history it reads, the cards it proposes, the diagnosis, the evidence rules
(`rules/`), value per device-hour, predictions, the checks every proposal passes, the judgement of a run, the
stops, screens and the proposers (`proposers/`: recoveries, the twin, coupled pairs, the rules' moves, the
explorer), the deterministic planner (`deterministic.py`, its `ask` a pipeline of named steps in `steps.py`), the
LLM planner (`llm.py`) and the pre-screen (`prescreen.py`), composed into the planner a session uses in one place
(`compose.py`). It imports only `core/`, `prompts/` and itself: no store, no executor, no langgraph
(tests/test_layering.py holds it to that), and it writes nothing: what the pre-screen sets aside comes back on the
plan for the loop to record.

This is the front door: code outside the package imports these names from `agent.planner`. Each is loaded on
first use (PEP 562), so a caller that needs a card's words does not load the explorer's optuna.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_HOME = {  # public name -> the module that holds it
    "Plan": "plan", "PlanRow": "plan", "Planner": "plan", "SetAside": "plan", "Stop": "plan", "StopKind": "plan",
    "Refusal": "refusals", "RefusalKind": "refusals", "said": "refusals",
    "LLMEndpoint": "compose", "build_planner": "compose",
    "DeterministicPlanner": "deterministic", "candidates": "deterministic", "carry_diagnosis": "deterministic",
    "closes_hypothesis": "deterministic", "diagnosis_for": "deterministic",
    "LLMPlanner": "llm", "Prescreened": "prescreen", "calibrated": "prescreen",
    "CandidateCard": "candidates", "Change": "candidates", "build_card": "candidates", "card_of": "candidates",
    "card_record": "candidates", "change_words": "candidates", "direction_of": "candidates",
    "check": "checks", "estimate": "checks", "with_attempt": "checks",
    "CostModel": "costs", "Diagnosis": "diagnosis", "wants_profile": "diagnosis",
    "Figures": "history", "History": "history", "Negative": "history", "Outcome": "history", "Veto": "history",
    "QualityFailure": "history", "judge_run": "judgement", "observed": "prediction", "predict": "prediction",
    "runs_of": "twin", "Fitter": "twin_fit", "TwinFit": "twin_fit",
}
_RENAMED = {"judge_run": "decide"}  # the front door's name where the module's own would be ambiguous
__all__ = sorted(_HOME)


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module 'agent.planner' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"agent.planner.{_HOME[name]}"), _RENAMED.get(name, name))
    globals()[name] = value
    return value


if TYPE_CHECKING:  # the names as a type checker sees them
    from agent.planner.candidates import (CandidateCard, Change, build_card, card_of, card_record, change_words,
                                          direction_of)
    from agent.planner.checks import check, estimate, with_attempt
    from agent.planner.compose import LLMEndpoint, build_planner
    from agent.planner.costs import CostModel
    from agent.planner.deterministic import (DeterministicPlanner, candidates, carry_diagnosis, closes_hypothesis,
                                             diagnosis_for)
    from agent.planner.diagnosis import Diagnosis, wants_profile
    from agent.planner.history import Figures, History, Negative, Outcome, QualityFailure, Veto
    from agent.planner.judgement import decide as judge_run
    from agent.planner.llm import LLMPlanner
    from agent.planner.plan import Plan, PlanRow, Planner, SetAside, Stop, StopKind
    from agent.planner.refusals import Refusal, RefusalKind, said
    from agent.planner.prediction import observed, predict
    from agent.planner.prescreen import Prescreened, calibrated
    from agent.planner.twin import runs_of
    from agent.planner.twin_fit import Fitter, TwinFit
