"""The capture folder, attnprobe's main product, in one place: where ``attnprobe capture --out OUT`` (and every
study that captures) puts each trajectory's result, and the names of a result folder's files. Every other
module reads these names from here (the app, the report, the counterfactual and IBIS layouts), so a file is
spelled once."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from attnprobe.io import ERRORS_FILE, safe_name


@dataclass(frozen=True)
class CaptureLayout:
    """``OUT/<safe trajectory id>/`` per trajectory (a result folder: :attr:`META` with the settings and
    segments, :attr:`TEXT`, :attr:`SCORES`, and :attr:`QK` when query/key vectors were saved), and
    ``OUT/errors.jsonl`` for the trajectories that failed."""

    root: Path

    META = "meta.json"
    TEXT = "text.json"
    SCORES = "scores.safetensors"
    QK = "qk.safetensors"

    def folder(self, trajectory_id: str) -> Path:
        """The result folder of one trajectory (its id made a safe file name)."""
        return Path(self.root) / safe_name(trajectory_id)

    @property
    def errors(self) -> Path:
        return Path(self.root) / ERRORS_FILE

    @classmethod
    def meta(cls, folder: Path) -> Path:
        """A result folder's metadata file: it is written last, so its time is the result's."""
        return Path(folder) / cls.META
