"""Deterministic execution: targets, load generator, metrics, verdicts. No LLM, no langgraph."""
