"""tuneloop agent package."""
