"""Reading counterfactual step records defensively: one malformed ``record.json`` is skipped and listed
with its reason, never a KeyError that takes the whole summary, report or app page with it (issue 22).

:func:`record_problem` checks every field the summaries and the app read; :func:`iter_record_files`
walks a run folder without following symlinked folders and yields ``(path, record or None, problem)``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from attnprobe.counterfactual.analysis import GROUPS, QUERY_NAMES
from attnprobe.counterfactual.layout import RECORD_FILE, STEP_PREFIX


def _groups() -> tuple[str, ...]:
    return GROUPS


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _get(record: Any, path: Sequence[str]) -> tuple[Any, str | None]:
    cur = record
    for i, k in enumerate(path):
        if not isinstance(cur, Mapping):
            where = ".".join(path[:i]) or "the record"
            return None, f"{where} is {type(cur).__name__}, not an object"
        if k not in cur:
            return None, f"missing {'.'.join(path[: i + 1])!r}"
        cur = cur[k]
    return cur, None


def _need(record: Any, path: Sequence[str], kind: str) -> str | None:
    value, problem = _get(record, path)
    if problem:
        return problem
    name = ".".join(path)
    if kind == "number" and not _number(value):
        return f"{name!r} is {type(value).__name__} {str(value)[:40]!r}, not a finite number"
    if kind == "str" and not isinstance(value, str):
        return f"{name!r} is {type(value).__name__}, not a string"
    if kind == "object" and not isinstance(value, Mapping):
        return f"{name!r} is {type(value).__name__}, not an object"
    return None


def record_problem(record: Any, *, app: bool = False) -> str | None:
    """Why ``record`` cannot be summarised (None when it can). ``app``: also the fields the app page
    shows (step index, turn, roles, changes)."""
    if not isinstance(record, Mapping):
        return f"the record is {type(record).__name__}, not an object"
    checks: list[tuple[tuple[str, ...], str]] = [
        (("policy",), "str"), (("trajectory_id",), "str"), (("tokens", "saved"), "number"),
        (("tokens", "saved_share"), "number")]
    if app:
        checks += [(("step_message_index",), "number"), (("turn",), "number"), (("changes",), "object")]
    for q in QUERY_NAMES:
        checks += [(("queries", q, "removed_mass"), "number"), (("queries", q, "removed_observation_mass"), "number"),
                   (("queries", q, "redistribution"), "object")]
        if not app:
            checks += [(("queries", q, k, g), "number") for k in ("original", "counterfactual") for g in _groups()]
            checks += [(("queries", q, "redistribution", g), "number") for g in _groups()]
    for path, kind in checks:
        problem = _need(record, path, kind)
        if problem:
            return problem
    if app and not (isinstance(record.get("roles"), list) and all(isinstance(r, str) for r in record["roles"])):
        return "'roles' is not a list of names"
    if "action" in record:
        for path, kind in ((("action", "original", "text"), "str"), (("action", "counterfactual", "text"), "str"),
                           (("action", "original", "decision"), "str"),
                           (("action", "counterfactual", "decision"), "str")):
            problem = _need(record, path, kind)
            if problem:
                return problem
    if "logprob" in record:
        for side in ("original", "counterfactual"):
            for k in ("sum", "mean"):
                problem = _need(record, ("logprob", side, k), "number")
                if problem:
                    return problem
    return None


def iter_record_files(root: str | Path) -> Iterator[tuple[Path, Any, str | None]]:
    """Every ``<trajectory>/<policy>/step_*/record.json`` under ``root``, sorted, without following
    symlinked folders (a symlinked step folder is listed as a problem): ``(path, record, problem)``
    where ``record`` is None when the file cannot be read and ``problem`` says why (or is None)."""
    from attnprobe.errors import AttnprobeError
    from attnprobe.io import load_json

    root = Path(root)
    found: list[tuple[Path, str | None]] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        here = Path(dirpath)
        depth = len(here.relative_to(root).parts)
        for d in sorted(dirnames):
            if (here / d).is_symlink() and depth == 2 and d.startswith(STEP_PREFIX):
                found.append((here / d / RECORD_FILE, "a symlinked step folder (not followed)"))
        if depth >= 3:
            dirnames[:] = []
        if depth == 3 and here.name.startswith(STEP_PREFIX) and RECORD_FILE in filenames:
            found.append((here / RECORD_FILE, None))
    for path, problem in sorted(found):
        if problem:
            yield path, None, problem
            continue
        try:
            if path.is_symlink() or not path.is_file():
                raise AttnprobeError(f"{path}: not a regular file")
            record = load_json(path)
        except (AttnprobeError, OSError) as exc:
            yield path, None, str(exc)
            continue
        yield path, record, record_problem(record)
