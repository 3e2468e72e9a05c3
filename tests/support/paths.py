"""Paths of the source tree that tests read (shipped data, docs)."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TRAJ_DIR = ROOT / "trajectories"
SAMPLE_FILES = ["long_research.jsonl", "parallel_calls.jsonl", "reasoning_content.jsonl"]
