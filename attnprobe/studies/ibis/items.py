"""IBIS items: a task, the search query that was run for it, the results it returned, and a label.

One JSON object per line::

    {"id": "sci-07", "domain": "science", "task": "...", "query": "...",
     "results": [{"title": "...", "url": "https://...", "snippet": "..."}, ...],
     "label": "should_research", "note": "why this label"}

Labels (rules in docs/ibis.md): ``should_research`` (no result addresses the information need:
re-searching is the only correct action), ``should_visit_page`` (at least one result looks relevant
from its title and snippet, but no snippet states the answer), and the optional
``should_return_answer`` (a snippet already states the answer) which, like the paper, is kept out
of the headline metrics. Unknown fields are kept. Errors name file, line and field.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attnprobe.errors import TrajectoryError
from attnprobe.io import read_jsonl
from attnprobe.io.fs import id_problem

LABELS = ("should_research", "should_visit_page", "should_return_answer")
HEADLINE_LABELS = ("should_research", "should_visit_page")
EXPECTED_ACTION = {"should_research": "web_search", "should_visit_page": "visit_page",
                   "should_return_answer": "answer"}
_KNOWN = ("id", "domain", "task", "query", "results", "label", "note")


class ItemError(TrajectoryError):
    """A malformed IBIS item (the message names file, line and field)."""


@dataclass
class IbisItem:
    id: str
    task: str
    query: str
    results: list[dict[str, str]]
    label: str
    domain: str = ""
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def expected_action(self) -> str:
        return EXPECTED_ACTION[self.label]

    @property
    def headline(self) -> bool:
        return self.label in HEADLINE_LABELS

    def to_dict(self) -> dict[str, Any]:
        out = {"id": self.id, "domain": self.domain, "task": self.task, "query": self.query,
               "results": [dict(r) for r in self.results], "label": self.label}
        if self.note:
            out["note"] = self.note
        out.update(self.extra)
        return out

    @classmethod
    def from_dict(cls, rec: Any, *, path: str | None = None, line: int | None = None) -> IbisItem:
        validate_item(rec, path=path, line=line)
        return cls(id=str(rec["id"]), task=rec["task"].strip(), query=rec["query"].strip(),
                   results=[{k: str(r[k]).strip() for k in ("title", "url", "snippet")} for r in rec["results"]],
                   label=rec["label"], domain=rec.get("domain") or "", note=rec.get("note") or "",
                   extra={k: v for k, v in rec.items() if k not in _KNOWN})


def _fail(msg, path, line, fld):
    raise ItemError(msg, path=path, line=line, field=fld)


def _nonempty_str(rec, key, path, line, fld=None):
    fld = fld or key
    if key not in rec or rec[key] is None:
        _fail("missing required field", path, line, fld)
    if not isinstance(rec[key], str):
        _fail(f"expected a string, got {type(rec[key]).__name__}", path, line, fld)
    if not rec[key].strip():
        _fail("must not be empty", path, line, fld)


def validate_item(rec: Any, *, path: str | None = None, line: int | None = None) -> None:
    """Raise :class:`ItemError` naming file, line and field for anything the pipeline cannot use."""
    if not isinstance(rec, dict):
        _fail(f"an IBIS item must be a JSON object, got {type(rec).__name__}", path, line, None)
    if "id" not in rec:
        _fail("missing required field", path, line, "id")
    problem = id_problem(rec["id"])  # it names folders
    if problem:
        _fail(problem, path, line, "id")
    for key in ("task", "query"):
        _nonempty_str(rec, key, path, line)
    if "label" not in rec:
        _fail("missing required field", path, line, "label")
    if rec["label"] not in LABELS:
        _fail(f"must be one of {', '.join(LABELS)}; got {rec['label']!r}", path, line, "label")
    if rec.get("domain") is not None and not isinstance(rec["domain"], str):
        _fail("expected a string", path, line, "domain")
    results = rec.get("results")
    if results is None:
        _fail("missing required field", path, line, "results")
    if not isinstance(results, list):
        _fail(f"expected a list of results, got {type(results).__name__}", path, line, "results")
    if not results:
        _fail("empty results: an IBIS item needs at least one search result to judge", path, line, "results")
    for i, res in enumerate(results):
        where = f"results[{i}]"
        if not isinstance(res, dict):
            _fail("a result must be an object with title, url and snippet", path, line, where)
        for key in ("title", "url", "snippet"):
            _nonempty_str(res, key, path, line, f"{where}.{key}")
        if not re.match(r"^https?://\S+$", res["url"].strip()):
            _fail("must be an absolute http(s) URL without spaces", path, line, f"{where}.url")
        for key in ("title", "snippet"):
            if "```" in res[key]:
                _fail("must not contain ``` (it would break the results block)", path, line, f"{where}.{key}")


def load_items(path: str | Path) -> list[IbisItem]:
    """Load and validate a JSON Lines file of IBIS items (duplicate ids are refused)."""
    path = Path(path)
    if not path.exists():  # anything else (a folder, a FIFO) is named by read_jsonl
        raise ItemError("file not found", path=str(path))
    items: list[IbisItem] = []
    seen: dict[str, int] = {}
    for lineno, rec in read_jsonl(path, error=ItemError):
        item = IbisItem.from_dict(rec, path=str(path), line=lineno)
        if item.id in seen:
            raise ItemError(f"duplicate id {item.id!r} (first on line {seen[item.id]})", path=str(path),
                            line=lineno, field="id")
        seen[item.id] = lineno
        items.append(item)
    if not items:
        raise ItemError("no items in file", path=str(path))
    return items


def results_text(item: IbisItem) -> str:
    """The results block exactly as every framing shows it (identical text in all framings)."""
    lines = []
    for i, r in enumerate(item.results, start=1):
        lines.append(f"{i}. [{r['title']}]({r['url']})\n   {r['snippet']}")
    return "\n".join(lines)
