"""tuneloop state package."""
