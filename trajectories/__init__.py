"""Shipped data (installed as the package ``attnprobe_data``): sample trajectories, IBIS items, the
runner's questions and corpus, and sample runs. Read it through :mod:`attnprobe.resources`."""
