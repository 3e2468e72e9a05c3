"""Shared fixtures: the bundled model is loaded once per test session."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TRAJ_DIR = ROOT / "trajectories"
SAMPLE_FILES = ["long_research.jsonl", "parallel_calls.jsonl", "reasoning_content.jsonl"]


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
