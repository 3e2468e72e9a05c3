"""Writing a (step, policy) folder and reading it back. Where it lives and when it counts as done is
:class:`~attnprobe.counterfactual.layout.CounterfactualLayout` (the one module that spells the names;
``step_dir``, ``step_done`` and the file names are re-exported here for the callers that import them).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from attnprobe.agents.policies import Counterfactual
from attnprobe.counterfactual.analysis import step_analysis
from attnprobe.counterfactual.layout import (
    COUNTERFACTUAL_DIR,
    MASSES_FILE,
    ORIGINAL_DIR,
    RECORD_FILE,
    SAFETENSORS_FILES,
    STEP_FILES,
    STEP_PREFIX,
    CounterfactualLayout,
)
from attnprobe.counterfactual.steps import Step
from attnprobe.io import AtomicDir, atomic_write_text, load_json
from attnprobe.render.rendering import message_turns
from attnprobe.results.result import CaptureResult
from attnprobe.trajectory.schema import Trajectory

__all__ = ["COUNTERFACTUAL_DIR", "MASSES_FILE", "ORIGINAL_DIR", "RECORD_FILE", "SAFETENSORS_FILES", "STEP_FILES",
           "clear_steps", "iter_records", "load_step", "reanalyse_step", "step_dir", "step_done", "write_step"]


def step_dir(out: Path, step: Step, policy: str) -> Path:
    """:meth:`CounterfactualLayout.step_dir` (no symlink below ``out`` followed)."""
    return CounterfactualLayout(Path(out)).step_dir(step, policy)


def step_done(out: Path, step: Step, policy: str, settings: dict, since: float | None = None) -> bool:
    """:meth:`CounterfactualLayout.step_done`: the one rule."""
    return CounterfactualLayout(Path(out)).step_done(step, policy, settings, since)


def write_step(directory: Path, record: dict, arrays: dict[str, np.ndarray], original: CaptureResult,
               counterfactual: CaptureResult) -> None:
    from safetensors.numpy import save_file

    with AtomicDir(directory) as tmp:
        original.save(tmp / ORIGINAL_DIR)
        counterfactual.save(tmp / COUNTERFACTUAL_DIR)
        save_file({k: np.ascontiguousarray(v) for k, v in arrays.items()}, str(tmp / MASSES_FILE))
        (tmp / RECORD_FILE).write_text(json.dumps(record, indent=1, ensure_ascii=False), encoding="utf-8")


def clear_steps(out: Path, steps: Sequence[Step], names: Sequence[str]) -> None:
    """--force: remove the step folders of these steps and policies."""
    for s in steps:
        for n in names:
            shutil.rmtree(step_dir(out, s, n), ignore_errors=True)


def reanalyse_step(directory: str | Path, trajectory: Trajectory) -> dict:
    """Recompute a step folder's numbers from its stored captures (no model): after a change to the
    analysis, or to check a folder. Rewrites ``record.json`` and ``masses.safetensors``."""
    from safetensors.numpy import save_file

    directory = Path(directory)
    record, _ = load_step(directory)
    original = CaptureResult.load(directory / ORIGINAL_DIR)
    counterfactual = CaptureResult.load(directory / COUNTERFACTUAL_DIR)
    i = int(record["step_message_index"])
    cfx = Counterfactual([], list(record["source"]), {int(k): v for k, v in record["changes"].items()}, record["policy"])
    step = Step(trajectory, i, int(record["turn"]))
    queries, arrays = step_analysis(original, counterfactual, cfx, step, message_turns(trajectory.messages))
    record["queries"] = queries
    save_file({k: np.ascontiguousarray(v) for k, v in arrays.items()}, str(directory / MASSES_FILE))
    atomic_write_text(directory / RECORD_FILE, json.dumps(record, indent=1, ensure_ascii=False))
    return record


def load_step(directory: str | Path) -> tuple[dict, dict[str, np.ndarray]]:
    """(record, arrays) of one finished step folder, read through :class:`CounterfactualLayout`."""
    layout = CounterfactualLayout(Path(directory))
    return layout.read_record(), layout.read_masses()


def iter_records(root: str | Path):
    """Every finished step record under ``root`` (``<trajectory>/<policy>/step_*/record.json``)."""
    for path in sorted(Path(root).glob(f"*/*/{STEP_PREFIX}*/{RECORD_FILE}")):
        yield load_json(path)
