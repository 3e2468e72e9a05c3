"""attnprobe.cli."""
