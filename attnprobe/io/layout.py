"""The base of every study's and stage's folder layout (``studies/*/layout.py``, ``counterfactual/layout.py``):
a folder, the app's data directory when the app reads it, and the one way paths below it are checked.

With ``root`` (the app) every path must resolve inside the data directory; without it (the CLI and the
jobs) no symlink below ``folder`` is followed (:func:`attnprobe.io.fs.layout_path`). A layout subclass adds
its names, paths, readers, ``problem()`` and ``done`` rule (docs/architecture.md, "A study")."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from attnprobe.io.fs import layout_path


@dataclass(frozen=True)
class FolderLayout:
    """``folder`` and, in the app, ``root`` (the data directory; ``folder`` is then resolved inside it)."""

    folder: Path
    root: Path | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "folder", Path(self.folder))
        if self.root is not None:
            object.__setattr__(self, "root", Path(self.root).resolve())
            object.__setattr__(self, "folder", layout_path(self.folder, self.folder, self.root))

    def path(self, *parts: str | os.PathLike) -> Path:
        """``folder/parts``, checked to its last part: a symlink anywhere below ``folder`` is refused."""
        return layout_path(self.folder, self.folder.joinpath(*parts), self.root)

    def _checked(self, path: Path, *, is_dir: bool = False) -> Path:
        """``path``, checked up to its folder in the CLI (a symlinked file is left to its reader, which
        skips it and says so) and to itself in the app; a folder (``is_dir``) always to itself."""
        layout_path(self.folder, path if is_dir or self.root is not None else path.parent, self.root)
        return path

    def where(self, path: Path) -> str:
        """How messages name ``path``: relative to the data directory in the app, else as given."""
        if self.root is not None:
            try:
                return Path(path).relative_to(self.root).as_posix()
            except ValueError:
                pass
        return str(path)
