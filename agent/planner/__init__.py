"""The planner's reasoning, pure: the history it reads, the cards it proposes, the diagnosis, the evidence rules
(`rules/`), value per device-hour, predictions, the checks every proposal passes, the judgement of a run, the
stops, screens and the proposers (coupled pairs, recoveries, the explorer, the pre-screen ranking), the
deterministic planner (`deterministic.py`) and the LLM planner (`llm.py`). It imports only `core/`, `prompts/`
and itself: no store, no executor, no langgraph (tests/test_layering.py holds it to that).
"""
