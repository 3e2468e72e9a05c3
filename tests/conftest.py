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
