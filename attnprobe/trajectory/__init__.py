"""attnprobe.trajectory."""
