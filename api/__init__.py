"""tuneloop api package."""
