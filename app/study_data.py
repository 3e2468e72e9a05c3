"""Data for the Study page: the folders ``attnprobe study interference`` writes (docs/loop.md, "Output").

A study folder holds ``study.json`` (per-setting summaries with CIs, paired comparisons with the baseline,
per-question outcomes; :func:`attnprobe.studies.loop.metrics.summarize`) and, per setting, ``<slug>/calls/<qid>.jsonl``
(every model call of a question, as sent, with ``meta.history``) and, once ``attnprobe study attention`` (or
``attnprobe capture OUT/<slug>/calls.jsonl --out OUT/<slug>/capture``) has run, ``<slug>/capture/<safe id>/``
(one capture per call). Every path comes from the study's layout
(:class:`attnprobe.studies.loop.layout.StudyLayout` with ``root`` = the data directory: the names, study.json's
reader and validator are those ``study attention`` uses) and is read through it or :mod:`attnprobe_app.data`,
so only inside the data directory and only JSON; every function returns problems as text instead of raising
on bad files.
No Streamlit import: the page (``views/study.py``) caches these.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from attnprobe.errors import AttnprobeError
from attnprobe.io import OutsideFolder, safe_name
from attnprobe.results.caveats import attention_caveats
from attnprobe.results.caveats import study_caveats as study_caveats_of
from attnprobe.results.formatting import format_ci
from attnprobe.results.result import META_FILE
from attnprobe.studies.loop.attention_report import (
    CATEGORIES,
    QUERY_LABELS,
    dropped_line,
    filtered_empty,
    models_label,  # noqa: F401  (the page names another capture model with the agent's)
    paired_rows,
    relative_paired_rows,
    relative_rows,
    results_stamps,
    share_rows,
    stale_reason,
    step_rows,
)
from attnprobe.studies.loop.call_shares import call_shares
from attnprobe.studies.loop.layout import ATTENTION_JSON as ATTENTION_FILE  # the page names it
from attnprobe.studies.loop.layout import STUDY_JSON, StudyLayout
from attnprobe.studies.loop.metrics import MEASURES
from attnprobe_app import data as D

CHANGE_KINDS = ("placeholder", "removed", "calls_removed", "refined")  # what a policy did to a history message
OUTCOMES = {True: "correct", False: "wrong"}
NO_ANSWER, NOT_SCORED, NOT_RUN = "no answer", "not scored", "not run"
REPLY_CHARS = 400


@dataclass
class Study:
    """One study folder: ``data`` is its study.json; ``settings`` in the study's order, baseline first
    among equals as the study wrote them."""

    rel: str
    data: dict
    settings: list[str]
    baseline: str
    root: Path | None = None  # the data directory it was read from (its layout's root)

    @property
    def label(self) -> str:
        cfg = self.data.get("config") or {}
        models = ", ".join(str(m) for m in self.data.get("models") or []) or "?"
        return f"{self.rel} · {cfg.get('scaffold', '?')} · {models} · {len(self.settings)} settings"

    def layout(self, root: Path | None = None) -> StudyLayout:
        """The study folder's :class:`StudyLayout` inside the data directory (every path checked inside it)."""
        root = Path(root if root is not None else self.root)
        return StudyLayout(root / self.rel, root=root)

    def setting_rel(self, setting: str) -> str:
        """The setting's folder, relative to the data directory (named as the study names it)."""
        return (Path(self.rel) / StudyLayout.setting_name(setting)).as_posix()


@dataclass
class Step:
    """One recorded model call of a question under a setting."""

    step: int
    call_id: str
    sent: int                      # messages sent to the model (the reply not counted)
    history_messages: int | None   # messages of the full history at that step
    changes: dict[str, list[int]]  # kind -> full-history indices (CHANGE_KINDS)
    reply: str
    tool_calls: list[str]
    input_tokens: int | None
    output_tokens: int | None
    capture: str | None = None     # capture folder relative to the data directory, when one exists
    capture_note: str = "no capture"
    num_turns: int | None = None   # turns of the capture (its meta.json), when captured
    model: str | None = None       # the agent's model, as the call record names it

    @property
    def policy(self) -> str:
        parts = [f"{k.replace('_', ' ')}: {', '.join(map(str, v))}" for k, v in self.changes.items() if v]
        return "; ".join(parts) or "nothing changed"


@dataclass
class Steps:
    steps: list[Step] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    capture_folder: bool = False  # the setting has a capture/ folder at all


# ------------------------------------------------------------------ study.json
def _num(v) -> bool:
    return v is None or (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v))


def _rel(root: Path, path: Path) -> Path:
    """A layout's path relative to the data directory, as the page names files (never resolved)."""
    return Path(path).relative_to(root)


def study_problem(obj) -> str | None:
    """The first thing in a parsed study.json the page cannot show, or None: the study's own validator
    (:meth:`StudyLayout.problem`, shared with ``study attention``)."""
    return StudyLayout.problem(obj)


def _data_error(exc: AttnprobeError) -> D.DataError:
    """A layout's refusal as the page's error (one line naming the file relative to the data directory)."""
    if isinstance(exc, D.DataError):
        return exc
    return (D.PathEscapeError if isinstance(exc, OutsideFolder) else D.DataError)(str(exc))


def load_study(root: Path, rel: str) -> Study:
    """The study in folder ``rel`` (inside ``root``), read by its layout; a DataError naming the file on
    anything wrong."""
    rel = D.rel_to(root, D.resolve_inside(root, rel))
    try:
        obj = StudyLayout(Path(root) / rel, root=Path(root)).read_study(stamps=False)
    except AttnprobeError as exc:
        raise _data_error(exc) from None
    return Study(rel, obj, list(obj["settings"]), obj["baseline"], Path(root))


def load_studies(root: Path, rels: list[str]) -> tuple[list[Study], list[str]]:
    """(readable studies, one 'skipped: ...' line per unreadable study.json)."""
    out, problems = [], []
    for rel in rels:
        try:
            out.append(load_study(root, rel))
        except D.DataError as exc:
            problems.append(f"skipped: {exc}")
    return out, problems


# ------------------------------------------------------------------ tables
def _cell(v, ci, *, pct: bool = False, digits: int = 1) -> str:
    """A value with its 95% CI, digits as study.md writes them (accuracy in %, ART 2 digits, else 1)."""
    return format_ci(v, ci, pct=pct, signed=False, digits=digits, unit="")


def settings_table(study: Study) -> list[dict]:
    """One row per setting: the study table's columns (study.md), each value with its bootstrap CI."""
    rows = []
    scorer = study.data.get("scorer")
    acc = "EM (%)" if scorer in (None, "em") else f"accuracy ({scorer}, %)"
    for s in study.settings:
        m = study.data["settings"][s]
        row = {"setting": s + (" (baseline)" if s == study.baseline else ""), "n": m.get("questions"),
               acc: _cell(m.get("accuracy"), m.get("accuracy_ci"), pct=True)}
        for key, _, label in MEASURES:
            row[label] = _cell(m.get(key), m.get(f"{key}_ci"), digits=2 if key == "art" else 1)
        row["no answer"] = m.get("no_answer")
        rows.append(row)
    return rows


def paired_table(study: Study) -> list[dict]:
    """Each setting against the baseline on the same questions: fixed, broken, accuracy difference, McNemar p."""
    rows = []
    for s, c in (study.data.get("paired") or {}).items():
        p = c.get("mcnemar_p")
        rows.append({"setting": s, "questions": c.get("questions"),
                     "fixed": len(c.get("fixed", [])), "broken": len(c.get("broken", [])),
                     "difference (points) [95% CI]": format_ci(c.get("accuracy_diff"), c.get("accuracy_diff_ci"),
                                                               pct=True, unit=""),
                     "McNemar exact p": f"{p:.3g}" if _num(p) and p is not None else "n/a",
                     "fixed questions": ", ".join(map(str, c.get("fixed", []))),
                     "broken questions": ", ".join(map(str, c.get("broken", [])))})
    return rows


def outcome(correct, answer, ran: bool = True) -> str:
    """correct / wrong / no answer (wrong, and the agent gave none) / not scored / not run."""
    if not ran:
        return NOT_RUN
    if answer is None and correct is not True:
        return NO_ANSWER
    return OUTCOMES.get(correct, NOT_SCORED)


def outcome_grid(study: Study) -> list[dict]:
    """One row per question: its outcome under every setting, and which settings fixed or broke it."""
    rows = []
    for qid, q in (study.data.get("questions") or {}).items():
        corr, ans = q.get("correct") or {}, q.get("answer") or {}
        rows.append({"question": qid, "type": q.get("type") or "",
                     **{s: outcome(corr.get(s), ans.get(s), s in corr) for s in study.settings},
                     "fixed by": ", ".join(q.get("fixed_by") or []), "broken by": ", ".join(q.get("broken_by") or []),
                     "text": q.get("question") or ""})
    return rows


# ------------------------------------------------------------------ steps of one question
def _reply(msg: dict) -> tuple[str, list[str]]:
    from attnprobe.trajectory.schema import message_text

    text = message_text(msg.get("content")) if msg.get("content") is not None else ""
    calls = []
    for c in msg.get("tool_calls") or []:
        f = (c or {}).get("function") or {} if isinstance(c, dict) else {}
        calls.append(f"{f.get('name', '?')}({f.get('arguments', '')})")
    return (text if len(text) <= REPLY_CHARS else text[:REPLY_CHARS] + " …"), calls


def _step(rec: dict, index: int) -> Step:
    meta = rec.get("meta") if isinstance(rec.get("meta"), dict) else {}
    hist = meta.get("history") if isinstance(meta.get("history"), dict) else {}
    changes: dict[str, list[int]] = {k: [] for k in CHANGE_KINDS}
    for i, kind in (hist.get("changes") or {}).items():
        if kind in changes:
            changes[kind].append(int(i))
    refined = sorted(int(i) for i in hist.get("refined") or [])
    changes["refined"] = sorted(set(changes["refined"]) | set(refined))
    for k in changes:
        changes[k].sort()
    messages = rec.get("messages") or []
    reply, calls = _reply(messages[-1]) if messages and isinstance(messages[-1], dict) else ("", [])
    usage = meta.get("usage") if isinstance(meta.get("usage"), dict) else {}
    step = meta.get("step")
    return Step(step=int(step) if isinstance(step, int) else index + 1, call_id=str(rec.get("id", "")),
                sent=max(len(messages) - 1, 0), history_messages=hist.get("messages"), changes=changes,
                reply=reply, tool_calls=calls, input_tokens=usage.get("input_tokens"),
                output_tokens=usage.get("output_tokens"), model=str(rec["model"]) if rec.get("model") else None)


def capture_agent_model(root: Path, rel: str, trajectory_id: str, meta: dict) -> str | None:
    """The agent model of a study's per-call capture (``<setting>/capture/<id>`` of the call with id
    ``trajectory_id``): the ``model`` of that call's record in ``<setting>/calls/<qid>.jsonl`` (the question
    from the capture's ``trajectory_meta``), else in ``<setting>/calls.jsonl`` or any ``calls/*.jsonl``; None
    for any other capture."""
    tm = meta.get("trajectory_meta") if isinstance(meta.get("trajectory_meta"), dict) else {}
    st = StudyLayout.of_capture(rel, root=Path(root))
    if st is None:
        return None
    paths = []
    try:
        if tm.get("question_id"):
            paths.append(st.calls(str(tm["question_id"])))
    except AttnprobeError:
        pass
    try:
        calls_dir = st.calls_dir
        paths += [st.calls_file, *(st.calls(p.stem) for p in sorted(calls_dir.glob("*.jsonl")))]
    except AttnprobeError:
        return None
    for path in paths:
        try:
            records = D.read_jsonl(root, path)[0]
        except AttnprobeError:
            continue
        rec = next((r for r in records if r.get("id") == trajectory_id), None)
        if rec is not None:
            return str(rec["model"]) if rec.get("model") else None
    return None


def call_models_label(capture_model, agent_model) -> str | None:
    """"capture model X, agent model Y" for one call whose capture (its meta.json ``model``) was made with
    another model than the agent's (the call record's ``model``), as study attention's tables say it; None
    when they agree or either is unknown."""
    c, a = (str(m) if m else None for m in (capture_model, agent_model))
    return f"capture model {c}, agent model {a}" if c and a and c != a else None


def question_steps(root: Path, study: Study, setting: str, qid: str) -> Steps:
    """The recorded calls of question ``qid`` under ``setting``, in step order, each with its capture
    (matched by the capture's ``trajectory_id`` = the call's id) when ``<slug>/capture/`` holds one."""
    out = Steps()
    root = Path(root)
    st = study.layout(root).setting(setting)
    try:
        path = st.calls(qid)  # the job names it by the question id as is
        if path.is_file():
            records, problems = D.read_jsonl(root, path)
        else:  # only the gathered file: this question's calls of it
            path = st.calls_file
            records, problems = D.read_jsonl(root, path)
            records = [r for r in records if isinstance(r.get("meta"), dict) and r["meta"].get("question_id") == qid]
    except AttnprobeError as exc:
        return Steps(problems=[str(exc)])
    out.problems += problems
    if not records:
        out.problems.append(f"{study.setting_rel(setting)}: no recorded calls of question {qid}")
        return out
    for i, rec in enumerate(records):
        try:
            out.steps.append(_step(rec, i))
        except (TypeError, ValueError, AttributeError) as exc:
            out.problems.append(f"{_rel(root, path).as_posix()} line {i + 1}: malformed call record ({exc})")
    out.steps.sort(key=lambda s: s.step)
    try:
        capdir = st.capture_dir
        out.capture_folder = capdir.is_dir()
    except AttnprobeError as exc:
        out.problems.append(str(exc))
        return out
    if out.capture_folder:
        for s in out.steps:
            _match_capture(root, _rel(root, capdir), s, out.problems)
    return out


def _match_capture(root: Path, capdir: Path, step: Step, problems: list[str]) -> None:
    """Set ``step.capture`` when ``capdir/<safe id>/meta.json`` is a capture of exactly this call."""
    rel = capdir / safe_name(step.call_id)
    try:
        meta_path = D.resolve_inside(root, rel / META_FILE)
        if not meta_path.is_file():
            return
        meta = D.read_json(root, rel / META_FILE)
    except D.DataError as exc:
        step.capture_note = f"capture unreadable: {exc}"
        problems.append(str(exc))
        return
    tid = meta.get("trajectory_id") if isinstance(meta, dict) else None
    if tid != step.call_id:
        step.capture_note = f"capture folder holds trajectory {tid!r}, not this call"
        problems.append(f"{rel.as_posix()}: holds trajectory {tid!r}, not call {step.call_id!r}")
        return
    step.capture, step.capture_note = rel.as_posix(), "captured"
    nt = meta.get("num_turns")
    step.num_turns = nt if isinstance(nt, int) and not isinstance(nt, bool) else None


def has_counterfactuals(root: Path, study: Study, setting: str) -> bool:
    """Whether ``<slug>/counterfactual/`` exists (the Counterfactual page shows its steps)."""
    try:
        return study.layout(root).counterfactual_dir(setting).is_dir()
    except AttnprobeError:
        return False


def attention_summary(root: Path, study: Study):
    """The study's ``attention.json`` (None when absent; its layout's reader); a DataError when unreadable."""
    try:
        return study.layout(root).read_attention()
    except AttnprobeError as exc:
        raise _data_error(exc) from None


def attention_dropped(root: Path, study: Study, summary) -> str | None:
    """The line the page shows instead of an attention.json computed from other results than study.json's
    (the rule study.md applies: :func:`attnprobe.studies.loop.attention_report.stale_reason`), or None when it
    is current."""
    results = study.data.get("results")
    why = (stale_reason(summary, results_stamps(results)) if isinstance(results, dict) else
           f"{STUDY_JSON} records no stamps of its results (made by an older attnprobe)")
    return dropped_line(why, (Path(root) / study.rel).as_posix()) if why else None


ATTENTION_TABLES = {"shares": share_rows, "per-token share relative to uniform": relative_rows,
                    "paired difference with the baseline": paired_rows,
                    "paired difference of per-token shares": relative_paired_rows, "per step": step_rows}


def first_table(summary) -> str:
    """The table the page shows first: the per-step one when the past-turn filter kept no call at either
    query (every other table is n/a; attention.md puts it first then too), else the shares."""
    try:
        empty = all(filtered_empty(summary, q) for q in ("decision", "reasoning"))
    except (KeyError, TypeError, AttributeError):
        empty = False
    return "per step" if empty else "shares"


def call_breakdown(result) -> dict[str, dict[str, float]]:
    """One captured call's attention per category at each query it has (decision, reasoning start), with
    the very function attention.md's numbers come from (:func:`attnprobe.studies.loop.call_shares.call_shares`:
    the seed-002 token convention, the chat template's text owned by the message it delimits), so the Study
    page's bar of a call is attention.md's row of that call (issue 37); categories in attention.md's order."""
    return {q: {c: float(v[c]) for c in CATEGORIES} for q, v in call_shares(result).items()}


def structured_title(data: dict) -> str:
    """The words the page title carries for a study run with --structured-actions (study.json ``config``)."""
    from attnprobe.results.caveats import structured_title as words

    cfg = data.get("config") if isinstance(data, dict) else None
    return words(bool(isinstance(cfg, dict) and cfg.get("structured_actions")))


def attention_rows(summary: dict, query: str, table: str = "shares") -> list[dict]:
    """One of attention.json's tables at ``query`` (``decision`` or ``reasoning``), as attention.md
    prints it (:data:`ATTENTION_TABLES`: :func:`attnprobe.studies.loop.attention_report.share_rows` and the
    others); a malformed file (or one written before these tables) is a DataError (the page shows it and
    goes on)."""
    try:
        return ATTENTION_TABLES[table](summary, query)
    except (KeyError, TypeError, AttributeError, ValueError) as exc:  # ValueError: a number given as text
        raise D.DataError(f"{ATTENTION_FILE}: unexpected layout ({type(exc).__name__}: {exc})") from None


def attention_query_label(query: str) -> str:
    return QUERY_LABELS.get(query, query)


def setting_calls(root: Path, study: Study, setting: str) -> list[dict]:
    """The recorded calls of one setting: its ``calls.jsonl`` (the study's current results), else every
    ``calls/<qid>.jsonl``; unreadable files and lines add none."""
    st = study.layout(root).setting(setting)
    try:
        if st.calls_file.is_file():
            return D.read_jsonl(root, st.calls_file)[0]
        calls_dir = st.calls_dir
        paths = sorted(calls_dir.glob("*.jsonl")) if calls_dir.is_dir() else []
        return [r for p in paths for r in D.read_jsonl(root, st.calls(p.stem))[0]]
    except AttnprobeError:
        return []


def study_caveats(root: Path, study: Study) -> list[str]:
    """The caveats of the study (a setting that retrieved nothing decided from its recorded calls,
    :func:`setting_calls`) and of its attention.json (:mod:`attnprobe.results.caveats`), computed from the
    data; an unreadable attention.json adds none (the page reports it where it shows the tables)."""
    try:
        out = study_caveats_of(study.data, {s: setting_calls(root, study, s) for s in study.settings})
    except (TypeError, ValueError, AttributeError):  # a study.json the page still shows, with odd values
        out = []
    try:
        summary = attention_summary(root, study)
    except D.DataError:
        summary = None
    if isinstance(summary, dict) and attention_dropped(root, study, summary) is None:  # stale: not shown
        try:
            out += [c for c in attention_caveats(summary) if c not in out]  # study.json's count is copied there
        except (KeyError, TypeError, AttributeError, ValueError):
            pass
    return out
