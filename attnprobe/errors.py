"""Exceptions with enough context (file, line, field) for a user to fix the input."""

from __future__ import annotations


class AttnprobeError(Exception):
    """Base class: every error the library raises on purpose derives from it."""


class TrajectoryError(AttnprobeError, ValueError):
    """A trajectory record is malformed. The message names file, line and field."""

    def __init__(self, message: str, *, path: str | None = None, line: int | None = None,
                 field: str | None = None):
        self.path, self.line, self.field, self.reason = path, line, field, message
        where = []
        if path is not None:
            where.append(str(path))
        if line is not None:
            where.append(f"line {line}")
        if field is not None:
            where.append(f"field '{field}'")
        super().__init__(f"{': '.join([', '.join(where)] if where else [])}{': ' if where else ''}{message}")


class RenderError(AttnprobeError, ValueError):
    """A message part could not be located in the rendered chat template output."""


class ModelNotFoundError(AttnprobeError, FileNotFoundError):
    """The requested model is not available locally (we never download at run time)."""


class TooLongError(AttnprobeError, ValueError):
    """A trajectory renders to more tokens than the configured limit."""
