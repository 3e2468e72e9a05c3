"""Shared fixtures: the bundled model is loaded once per test session."""

from __future__ import annotations

import pytest
from support.paths import SAMPLE_FILES, TRAJ_DIR


@pytest.fixture(scope="session")
def smol():
    import attnprobe

    return attnprobe.load_model("default")


@pytest.fixture(scope="session")
def samples():
    import attnprobe

    out = {}
    for name in SAMPLE_FILES:
        for traj in attnprobe.load_trajectories(TRAJ_DIR / name):
            out[traj.id] = traj
    return out


@pytest.fixture(autouse=True)
def _cli_logging_restored():
    """A test that runs ``attnprobe.cli.main`` sets up the CLI's log handlers (no propagation to the
    root logger); restore the loggers after it so that later tests' ``caplog`` sees their records."""
    import logging

    names = ("attnprobe", "attnprobe_hooks", "attnprobe_app")
    saved = {n: (list(logging.getLogger(n).handlers), logging.getLogger(n).level, logging.getLogger(n).propagate)
             for n in names}
    yield
    for n, (handlers, level, propagate) in saved.items():
        lg = logging.getLogger(n)
        lg.handlers[:] = handlers
        lg.setLevel(level)
        lg.propagate = propagate
