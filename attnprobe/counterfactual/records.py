"""Reading counterfactual step records defensively: one malformed ``record.json`` is skipped and listed
with its reason, never a KeyError that takes the whole summary, report or app page with it (issue 22).

:func:`record_problem` checks every field the summaries and the app read (the run folder's layout,
:class:`~attnprobe.counterfactual.layout.CounterfactualLayout`, validates through it; its
:func:`~attnprobe.counterfactual.layout.iter_record_files` walks a run folder).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from attnprobe.counterfactual.analysis import GROUPS, QUERY_NAMES


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
