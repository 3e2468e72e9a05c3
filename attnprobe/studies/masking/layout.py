"""The masking study's folder (``attnprobe study masking``): the one place its file and folder names are
spelled, the one reader and validator of its ``study.json``.

::

    OUT/
      captures/         the capture stage's folder (attnprobe capture's format; its own done rule)
      counterfactual/   the counterfactual stage's run folder (attnprobe counterfactual's; its own done rule)
      study.json  study.md

Not :class:`attnprobe.studies.loop.layout.StudyLayout`: that folder is one subfolder per setting (calls,
histories, results stamped per question, ``capture/``), while this one is two stage folders at the top and a
study.json of headline shares and decay curves (no settings, no baseline); the two studies may not import
each other (``.importlinter``). The units of work are the stages' (a capture, a counterfactual step), so
their ``done`` rules are the stages' own; this study's only file of its own is written last, from them.
Paths are checked as the interference layout checks them: no symlink below the folder in the CLI, inside
``root`` in the app.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnprobe.errors import AttnprobeError
from attnprobe.io import inside, load_json
from attnprobe.io.layout import FolderLayout

STUDY_JSON, STUDY_MD = "study.json", "study.md"
CAPTURES, COUNTERFACTUAL = "captures", "counterfactual"
FIELDS = ("headline", "seed002", "decay", "counterfactual")  # study.json's objects (study.MaskingStudy.finish)


@dataclass(frozen=True)
class MaskingLayout(FolderLayout):
    """One masking study folder; ``root``: the app's data directory (None in the CLI)."""

    @property
    def captures_dir(self) -> Path:
        return self._checked(self.folder / CAPTURES, is_dir=True)

    @property
    def counterfactual_dir(self) -> Path:
        return self._checked(self.folder / COUNTERFACTUAL, is_dir=True)

    @property
    def study_json(self) -> Path:
        return self._checked(self.folder / STUDY_JSON)

    @property
    def study_md(self) -> Path:
        return self._checked(self.folder / STUDY_MD)

    @staticmethod
    def problem(obj: Any) -> str | None:
        """The first thing wrong with a parsed masking study.json, naming the field, or None."""
        if not isinstance(obj, dict):
            return "expected a JSON object"
        for name in FIELDS:
            if not isinstance(obj.get(name), dict):
                return f"'{name}' is {type(obj.get(name)).__name__}, not an object"
        return None

    def read_study(self) -> dict:
        """study.json, checked (:meth:`problem`); missing, symlinked or bad: one clear error."""
        path = self.study_json
        if self.root is None:
            inside(self.folder, path)
        if not path.is_file():
            raise AttnprobeError(f"{self.folder}: not a masking study folder (no {STUDY_JSON})")
        obj = load_json(path)
        problem = self.problem(obj)
        if problem:
            raise AttnprobeError(f"{path}: {problem}")
        return obj
