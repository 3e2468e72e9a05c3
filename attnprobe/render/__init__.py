"""attnprobe.render."""
