"""The settings record of an output folder: what a command's results there were made with.

Every command that resumes into a folder (``capture``, ``counterfactual``, ``study interference``,
``study attention``, ``run``, the ``ibis`` stages) calls :func:`check_settings` once, under its lock and
before any model loads, and :func:`record_settings` once its run has something to show for it (an item
finished, now or before). The first such run writes its options to ``OUT/.attnprobe-settings.json`` (one
entry per command, so two commands can share a folder); a later run with another value of one of them is
refused in one line (which option, old and new value) unless ``--force``, which redoes the work and records
the new values. A run that finished nothing (no model loaded: exit 3; every item failed) records nothing, so
the corrected command is not refused. Mixing results of two settings in one folder, or a summary computed over the other one's results,
cannot happen silently.

Per-item inputs (a question's text, its gold answers) are not options: a changed item is different input,
which the command's own ``done`` rule reruns (its results carry a stamp of their inputs).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from attnprobe.errors import AttnprobeError
from attnprobe.io.atomic import atomic_write_text
from attnprobe.io.json import load_json
from attnprobe.io.urls import redact

SETTINGS_FILE = ".attnprobe-settings.json"
# The generation limit's key in the records written so far (loop and runner results, settings records, study.json,
# IBIS decisions): ``max_tokens``, its name before the code called it ``max_new_tokens`` (in code ``max_tokens`` is
# only the capture's prompt limit). Kept on disk so that every folder written before resumes without --force and the
# outputs stay byte-identical; :func:`as_recorded` is the one place the field gets its recorded key.
RECORDED_GENERATION_LIMIT = "max_tokens"


def as_recorded(options: Mapping) -> dict:
    """``options`` (an options record's ``asdict``) with the generation limit under its recorded key
    (:data:`RECORDED_GENERATION_LIMIT`), key order kept (records are written in that order)."""
    return {(RECORDED_GENERATION_LIMIT if k == "max_new_tokens" else k): v for k, v in options.items()}


def _short(value, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def settings_diff(old: Mapping, new: Mapping, names: Mapping[str, str] | None = None) -> list[str]:
    """The options whose recorded value differs, as ``--option OLD -> NEW``; a key one side lacks (an
    older attnprobe's record) is not compared."""
    names = names or {}
    return [f"{names.get(k, '--' + k.replace('_', '-'))} was {_short(old[k])}, now {_short(new[k])}"
            for k in new if k in old and old[k] != new[k]]


def _read(out: Path, force: bool) -> dict:
    path = out / SETTINGS_FILE
    if not path.is_file():
        return {}
    try:
        recorded = load_json(path)
    except AttnprobeError as exc:
        if not force:
            raise AttnprobeError(f"{path}: unreadable settings record ({exc}); use --force to redo or "
                                 "another --out") from None
        return {}
    return recorded if isinstance(recorded, dict) else {}


def check_settings(out: str | Path, command: str, wanted: Mapping, *, force: bool = False,
                   names: Mapping[str, str] | None = None) -> None:
    """Refuse ``command``'s rerun into ``out`` with options other than those recorded there (unless
    ``force``). ``wanted``: JSON values by option key; ``names``: how a key is spelled on the command line
    (default ``--key-with-dashes``). Writes nothing: :func:`record_settings` does, once the run finished
    something. The caller holds ``out``'s lock."""
    out = Path(out)
    wanted = json.loads(redact(json.dumps(dict(wanted), default=str)))  # as read back; no URL's credentials
    old = _read(out, force).get(command)
    if isinstance(old, dict) and not force:
        diffs = settings_diff(old, wanted, names)
        if diffs:
            more = f" (and {len(diffs) - 1} more)" if len(diffs) > 1 else ""
            raise AttnprobeError(f"{out}: {command} ran there with other options: {diffs[0]}{more}; use --force "
                                 "to redo or another --out")


def finished_something(counts: Mapping) -> bool:
    """Whether a run's counts (``done``, ``done_before``, or a stage's own name for done) show a finished
    item: only then are its options recorded (:func:`record_settings`)."""
    return any(int(v or 0) > 0 for k, v in counts.items() if k != "failed")


def record_settings(out: str | Path, command: str, wanted: Mapping, *, force: bool = False) -> None:
    """Record ``wanted`` as ``command``'s options in ``out`` (after :func:`check_settings` passed, and only
    once the run finished something: :func:`finished_something`); ``force``: replace the old entry, else
    add to it. The caller holds ``out``'s lock."""
    out = Path(out)
    wanted = json.loads(redact(json.dumps(dict(wanted), default=str)))  # as check_settings compares it
    recorded = _read(out, force)
    old = recorded.get(command)
    if old == wanted:
        return
    recorded[command] = {**(old if isinstance(old, dict) and not force else {}), **wanted}
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / SETTINGS_FILE, json.dumps(recorded, indent=1, ensure_ascii=False, sort_keys=True))
