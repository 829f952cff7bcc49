"""Tuner-efficiency benchmark (issue 9): tuneloop's planner against grid, random and Optuna TPE search."""
