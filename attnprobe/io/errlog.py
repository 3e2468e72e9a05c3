"""``errors.jsonl``: the failures a long run records and moves past (the item is retried on the next run)."""

from __future__ import annotations

import time
from pathlib import Path

from attnprobe.errors import AttnprobeError
from attnprobe.io.json import append_jsonl
from attnprobe.io.urls import redact

# Failures an executor records and moves past (the item is retried on the next run); anything else
# (KeyboardInterrupt, programming errors) stops the run.
ERRORS_FILE = "errors.jsonl"  # in a job's folder (its ``out``): written by every executor, read by the layouts
EXPECTED_ERRORS: tuple[type[BaseException], ...] = (AttnprobeError, OSError, RuntimeError, ValueError)


def log_error(errors_path: Path, stage: str, what: dict, exc: BaseException) -> None:
    """One line of ``errors.jsonl``: the stage, what failed, and why (retried on the next run); URL credentials
    in any of them are redacted (:func:`attnprobe.io.urls.redact`)."""
    what = {k: redact(v) if isinstance(v, str) else v for k, v in what.items()}
    append_jsonl(errors_path, {"stage": redact(stage), **what, "error": redact(f"{type(exc).__name__}: {exc}"),
                               "time": time.time()})
