"""Where the shipped data lives: the package ``attnprobe_data`` (the repository's ``trajectories/``).

Found through :mod:`importlib.resources`, so it works the same from a source checkout, an editable
install and a non-editable ``pip install .`` run from any directory.
"""

from __future__ import annotations

import importlib.resources
from pathlib import Path

from attnprobe.errors import AttnprobeError

DATA_PACKAGE = "attnprobe_data"
SAMPLE_TRAJECTORIES = ("long_research.jsonl", "parallel_calls.jsonl", "reasoning_content.jsonl")


def data_path(*parts: str) -> Path:
    """A shipped file or folder, e.g. ``data_path("ibis_items.jsonl")``; a clear error if it is missing."""
    try:
        root = importlib.resources.files(DATA_PACKAGE)
    except ModuleNotFoundError:
        raise AttnprobeError(f"the shipped data package {DATA_PACKAGE!r} is not installed "
                             "(reinstall attnprobe: pip install .)") from None
    path = Path(str(root.joinpath(*parts)))
    if not path.exists():
        raise AttnprobeError(f"shipped data file missing from the installation: {'/'.join(parts)} (looked in {root})")
    return path
