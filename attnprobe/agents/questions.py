"""Question sets in the formats users already have: the one reader of QA-style JSON Lines, used by the
NIS-Agent runner (``attnprobe run``) and the in-the-loop study (``attnprobe study ...``) alike.

Accepted field names (the first present one wins):

- question: ``question`` (NQ, HotpotQA, 2Wiki, MuSiQue, FlashRAG), ``Question`` (Bamboogle), ``query``
  (BrowseComp-Plus), ``problem``, ``task`` (attnprobe's own questions file);
- answers: ``golden_answers`` (FlashRAG), ``answers``, ``answer`` (a string, a list, or TriviaQA's
  ``{"value", "aliases"}``), ``Answer`` (Bamboogle), ``possible_answers`` (PopQA: a list or a JSON string);
  aliases from ``answer_aliases`` (MuSiQue) and ``aliases`` are added;
- id: ``id``, ``_id`` (HotpotQA, 2Wiki), ``qid``, ``query_id`` (BrowseComp-Plus), ``question_id``;
  default ``q<line>``;
- hops/type, kept for the per-type tables: ``type`` (HotpotQA/2Wiki), ``metadata.type`` (FlashRAG), ``hops``.

Files: JSON Lines (FlashRAG's test splits, ``RUC-NLPIR/FlashRAG_datasets``: ``{"id", "question",
"golden_answers", "metadata"}`` per line) or Parquet (``.parquet``: Search-R1's ``test.parquet``, written by
``scripts/data_process/qa_search_test_merge.py`` from those splits; the FlashRAG columns are kept beside its
``prompt`` / ``reward_model`` / ``extra_info``, so the same fields are read; ``pyarrow`` is needed, as for any
Parquet file). Every error names the file, the line (Parquet: the row) and the field, before any model is loaded.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from attnprobe.errors import AttnprobeError
from attnprobe.io import located_error, read_jsonl
from attnprobe.io.fs import id_problem

QUESTION_FIELDS = ("question", "Question", "query", "problem", "task")
ANSWER_FIELDS = ("golden_answers", "answers", "answer", "Answer", "possible_answers")
ALIAS_FIELDS = ("answer_aliases", "aliases")
ID_FIELDS = ("id", "_id", "qid", "query_id", "question_id")


class QuestionsError(AttnprobeError, ValueError):
    """A questions file that cannot be read (names file, line and field)."""


def _bad(path: Path, line: str, field: str, message: str) -> QuestionsError:
    return QuestionsError(f"{path}, {line}: field '{field}': {message}")


def _scalar(v: Any) -> bool:
    return isinstance(v, (str, int, float)) and not isinstance(v, bool) and str(v).strip() != ""


def _answer_list(value: Any, path: Path, line: str, field: str) -> list[str]:
    answers = _answer_items(value, path, line, field)
    if any("\x00" in a for a in answers):
        raise _bad(path, line, field, "contains a NUL character")
    return answers


def _answer_items(value: Any, path: Path, line: str, field: str) -> list[str]:
    if field == "possible_answers" and isinstance(value, str) and value.strip().startswith("["):
        try:  # PopQA stores the list as a JSON string
            value = json.loads(value)
        except json.JSONDecodeError:
            raise _bad(path, line, field, "a string that starts with '[' but is not a JSON list") from None
    if isinstance(value, dict):  # TriviaQA: {"value": ..., "aliases": [...]}
        items = [value.get("value"), *(value.get("aliases") or [])]
        items = [x for x in items if _scalar(x)]
        if not items:
            raise _bad(path, line, field, "an answer object needs 'value' or 'aliases'")
        return [str(x).strip() for x in items]
    if _scalar(value):
        return [str(value).strip()]
    if isinstance(value, list) and value and all(_scalar(x) for x in value):
        return [str(x).strip() for x in value]
    what = "an empty list" if value == [] else "a list with a non-string item" if isinstance(value, list) \
        else type(value).__name__
    raise _bad(path, line, field, f"expected a string or number or a non-empty list of them, got {what}")


def _first(rec: dict, fields: tuple[str, ...]) -> str | None:
    return next((f for f in fields if f in rec), None)


def _parquet_rows(path: Path):
    """(row number from 1, record) of a Parquet file."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise QuestionsError(f"{path}: reading Parquet needs pyarrow (pip install pyarrow), "
                             "or give the split as JSON Lines") from None
    try:
        rows = pq.read_table(path).to_pylist()
    except Exception as exc:  # pyarrow's errors have no common base; name the file and the reason
        raise QuestionsError(f"{path}: not a readable Parquet file ({type(exc).__name__}: {exc})"[:400]) from None
    return enumerate(rows, 1)


def read_questions(path: str | Path) -> list[dict]:
    """Questions as ``{"id", "question", "answers": [...], "type"}`` (``answers`` empty when the file has
    none: such questions are run but not scored; :func:`attnprobe.agents.answers.exact_match` scores
    against all of them)."""
    path = Path(path)
    if not path.exists():  # anything else (a folder, a FIFO) is named by read_jsonl
        raise QuestionsError(f"questions file not found: {path}")
    out, seen = [], set()
    parquet = path.suffix.lower() == ".parquet"
    rows = _parquet_rows(path) if parquet else read_jsonl(path, error=located_error(QuestionsError))
    for n, rec in rows:
        line = f"row {n}" if parquet else f"line {n}"
        if not isinstance(rec, dict):
            raise QuestionsError(f"{path}, {line}: expected a JSON object, got {type(rec).__name__}")
        qf = _first(rec, QUESTION_FIELDS)
        if qf is None:
            raise _bad(path, line, "question", f"missing (looked for {', '.join(QUESTION_FIELDS)})")
        q = rec[qf]
        if not isinstance(q, str) or not q.strip():
            raise _bad(path, line, qf, "must be a non-empty string")
        if "\x00" in q:
            raise _bad(path, line, qf, "contains a NUL character")
        idf = _first(rec, ID_FIELDS)
        qid = rec[idf] if idf else f"q{n:03d}"
        problem = id_problem(qid)  # the id names files (calls/<id>.jsonl): checked before any model loads
        if problem:
            raise _bad(path, line, idf or "id", problem)
        qid = str(qid)
        if qid in seen:
            raise _bad(path, line, idf or "id", f"duplicate id {qid!r}")
        seen.add(qid)
        present = [f for f in ANSWER_FIELDS if f in rec]
        af = present[0] if present else None
        if af and rec[af] is None and any(rec[f] is not None for f in present[1:]):
            other = next(f for f in present[1:] if rec[f] is not None)
            raise _bad(path, line, af, f"is null but '{other}' has a value: which is the gold answer? "
                                       f"Remove '{af}' or give it the answers")
        answers = _answer_list(rec[af], path, line, af) if af and rec[af] is not None else []
        for alias_field in ALIAS_FIELDS:
            if alias_field in rec and rec[alias_field] not in (None, []):
                answers += [a for a in _answer_list(rec[alias_field], path, line, alias_field) if a not in answers]
        meta = rec.get("metadata") if isinstance(rec.get("metadata"), dict) else {}
        kind = rec.get("type", meta.get("type", rec.get("hops")))
        out.append({"id": qid, "question": q.strip(), "answers": answers,
                    "type": str(kind) if kind is not None else None})
    if not out:
        raise QuestionsError(f"{path}: no questions")
    return out
