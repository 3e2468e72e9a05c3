"""attnprobe.generation."""
