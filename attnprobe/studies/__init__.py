"""attnprobe.studies."""
