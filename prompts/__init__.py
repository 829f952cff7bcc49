"""tuneloop prompts package."""
