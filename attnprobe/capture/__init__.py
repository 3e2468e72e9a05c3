"""attnprobe.capture."""
