"""attnprobe.results."""
