"""tuneloop simulator package."""
