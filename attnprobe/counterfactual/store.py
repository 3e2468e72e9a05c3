"""Where a (step, policy) lives on disk, when it counts as done, and reading it back.

``OUT/<trajectory>/<policy>/step_<i>/`` (atomic; ``record.json`` written last) holds ``record.json``,
``masses.safetensors`` and the two capture results ``original/`` and ``counterfactual/``.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from attnprobe.agents.policies import Counterfactual
from attnprobe.counterfactual.analysis import step_analysis
from attnprobe.counterfactual.steps import Step
from attnprobe.errors import AttnprobeError
from attnprobe.io import AtomicDir, atomic_write_text, load_json, safe_name, safetensors_problem
from attnprobe.render.rendering import message_turns
from attnprobe.results.result import META_FILE, SCORES_FILE, CaptureResult
from attnprobe.trajectory.schema import Trajectory

RECORD_FILE, MASSES_FILE = "record.json", "masses.safetensors"
STEP_FILES = (RECORD_FILE, MASSES_FILE, f"original/{META_FILE}", f"counterfactual/{META_FILE}")
SAFETENSORS_FILES = (MASSES_FILE, f"original/{SCORES_FILE}", f"counterfactual/{SCORES_FILE}")


def step_dir(out: Path, step: Step, policy: str) -> Path:
    return Path(out) / safe_name(step.trajectory.id) / safe_name(policy) / step.key


def step_done(out: Path, step: Step, policy: str, settings: dict, since: float | None = None) -> bool:
    """Done: every file of the step folder is there, its record was made with ``settings`` from a
    trajectory with the same content hash (a changed trajectory is redone), and (``since``) it was
    written at or after that time. An unreadable record means the step is redone."""
    folder = step_dir(out, step, policy)
    path = folder / RECORD_FILE
    if not all((folder / f).is_file() for f in STEP_FILES):
        return False
    if any(safetensors_problem(folder / f) for f in SAFETENSORS_FILES):  # truncated: not done, redone
        return False
    try:
        record = load_json(path)
        if since is not None and path.stat().st_mtime < since:
            return False
    except (AttnprobeError, OSError):  # unreadable (torn, not UTF-8, too large): redo the step
        return False
    return (isinstance(record, dict) and record.get("settings") == settings
            and record.get("trajectory_hash") == step.trajectory.content_hash())


def write_step(directory: Path, record: dict, arrays: dict[str, np.ndarray], original: CaptureResult,
               counterfactual: CaptureResult) -> None:
    from safetensors.numpy import save_file

    with AtomicDir(directory) as tmp:
        original.save(tmp / "original")
        counterfactual.save(tmp / "counterfactual")
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
    original = CaptureResult.load(directory / "original")
    counterfactual = CaptureResult.load(directory / "counterfactual")
    i = int(record["step_message_index"])
    cfx = Counterfactual([], list(record["source"]), {int(k): v for k, v in record["changes"].items()}, record["policy"])
    step = Step(trajectory, i, int(record["turn"]))
    queries, arrays = step_analysis(original, counterfactual, cfx, step, message_turns(trajectory.messages))
    record["queries"] = queries
    save_file({k: np.ascontiguousarray(v) for k, v in arrays.items()}, str(directory / MASSES_FILE))
    atomic_write_text(directory / RECORD_FILE, json.dumps(record, indent=1, ensure_ascii=False))
    return record


def load_step(directory: str | Path) -> tuple[dict, dict[str, np.ndarray]]:
    """(record, arrays) of one finished step folder."""
    from safetensors.numpy import load_file

    directory = Path(directory)
    path = directory / RECORD_FILE
    if not path.is_file():
        raise AttnprobeError(f"{directory}: not a counterfactual step (no {RECORD_FILE})")
    return load_json(path), load_file(str(directory / MASSES_FILE))


def iter_records(root: str | Path):
    """Every finished step record under ``root`` (``<trajectory>/<policy>/step_*/record.json``)."""
    for path in sorted(Path(root).glob(f"*/*/step_*/{RECORD_FILE}")):
        yield load_json(path)
