"""Self-contained HTML report (plotly figures, plotly.js embedded once) over capture folders;
the page is the Jinja template ``templates/report.html``."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np

from attnprobe._version import __version__
from attnprobe.errors import AttnprobeError
from attnprobe.io import atomic_write_text, ensure_writable_file, is_work_dir, load_json
from attnprobe.results.analysis import decay_curves, headline, heatmap, step_breakdown
from attnprobe.results.figures import HEATMAP_GREY_NOTE, decay_figure, heatmap_figure, step_breakdown_figure
from attnprobe.results.formatting import format_ci, template_env
from attnprobe.results.result import META_FILE, CaptureResult

log = logging.getLogger(__name__)

HEADLINE_ROWS = (  # (label, key of analysis.headline) with its defaults: steps with >= 5 past turns, 20 bins
    ("mean attention to past reasoning", "past_reasoning_share"),
    ("mean attention to past tool calls", "past_tool_call_share"),
    ("mean attention to past observations", "past_observation_share"),
    ("reasoning share of (past reasoning + past observations)", "reasoning_vs_observation"),
    ("share of observation attention on the newest 10% of past turns", "recent10_observation_share"),
    ("share of observation attention on the newest half of past turns", "midpoint_observation_share"),
    ("share of reasoning attention on the newest half of past turns", "midpoint_reasoning_share"),
)


@cache
def _template():
    return template_env("attnprobe.results").get_template("report.html")


@dataclass(frozen=True)
class Section:
    """A part of the report that another study contributes (rendered after the overall numbers):
    ``parts`` are dicts with ``anchor``, ``name``, ``info`` (rows), ``head`` (column names) and
    ``tables`` ((title, rows) pairs)."""

    title: str
    anchor: str
    legend: str
    parts: list[dict]


@dataclass(frozen=True)
class ExtraSection:
    """How a caller adds a study's section without this module knowing the study: a folder holding
    ``marker`` (a file name) belongs to it and is not read as a capture; ``build(root, folders, skipped)``
    gets every such folder found below ``root`` and returns the Section (or None: nothing to show),
    appending (path, reason) to ``skipped`` for anything it cannot read. It must not raise for bad data."""

    marker: str
    build: Callable[[Path, list[Path], list[tuple[str, str]]], Section | None]


def find_results(root: Path, skipped: list[tuple[str, str]] | None = None,
                 owned: dict[str, list[Path]] | None = None) -> list[Path]:
    """Every capture folder below root (a folder whose meta.json has a trajectory_id).

    A folder holding one of the marker files named by ``owned``'s keys (another study's records, see
    :class:`ExtraSection`) is not entered; it is appended to ``owned[marker]``.
    Dot-folders are not entered (AtomicDir's work folders of an interrupted save, ``.git``); symlinked
    folders are not followed. A meta.json that is unreadable, over :data:`attnprobe.io.MAX_JSON_BYTES`
    (checked before reading), not a regular file or not JSON is appended to ``skipped`` as (path, reason)
    and logged; one that is valid JSON without our keys belongs to another tool and is passed over quietly.
    """
    out = []
    owned = owned if owned is not None else {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not is_work_dir(d))
        marker = next((m for m in owned if m in filenames), None)
        if marker is not None:  # another study's folder: its section reads it
            dirnames[:] = []
            owned[marker].append(Path(dirpath))
            continue
        if META_FILE not in filenames:
            continue
        meta = Path(dirpath) / META_FILE
        try:
            data = load_json(meta)
        except AttnprobeError as exc:
            log.warning("skipping %s", exc)
            if skipped is not None:
                skipped.append((str(meta.parent), str(exc)))
            continue
        if isinstance(data, dict) and "trajectory_id" in data and "format_version" in data:
            out.append(meta.parent)
        else:
            log.debug("%s: not a capture result (no trajectory_id/format_version)", meta)
    return sorted(out)


def variant_label(meta: dict) -> str:
    """How a report names a model variant: results of different dtypes, backends or weights are
    never pooled (see attnprobe.capture.api.variant_key)."""
    weights = meta.get("weights_hash")
    return (f"{meta.get('model', '?')} ({meta.get('dtype', '?')}, {meta.get('backend', '?')}"
            f"{', weights ' + weights[:8] if weights else ''})")


QUERY_KINDS = {  # CaptureResult query kind -> (singular, plural) as the report says it
    "reasoning": ("reasoning step", "reasoning steps"), "action": ("tool-call-only step", "tool-call-only steps"),
    "decision": ("decision", "decisions"), "token": ("chosen token", "chosen tokens")}


def describe_queries(queries) -> str:
    """The one count a capture section shows for its queries, by kind, e.g. "3 queries: 2 reasoning
    steps, 1 decision" or "1 query (decision only); no reasoning-step queries" (the heatmap and the
    step breakdown use the reasoning-step queries only, so their absence is said in the same breath)."""
    counts: dict[str, int] = {}
    for q in queries:
        counts[q.kind] = counts.get(q.kind, 0) + 1
    n = len(queries)
    if not n:
        return "no queries"
    names = {k: QUERY_KINDS.get(k, (k, k))[c != 1] for k, c in counts.items()}
    text = f"{n} quer{'y' if n == 1 else 'ies'}"
    if len(counts) == 1:
        text += f" ({next(iter(names.values()))} only)"
    else:
        text += ": " + ", ".join(f"{c} {names[k]}" for k, c in counts.items())
    return text if "reasoning" in counts else text + "; no reasoning-step queries"


def capture_group(meta: dict, folder: str | None = None) -> tuple[str, str, tuple]:
    """(group, label, sort key) of a capture in the report's index.

    Runner calls (``trajectory_meta.run_id`` from ``attnprobe run``) group by run (and question, when
    the meta names one) and are labelled by agent and call index; IBIS framings group by item and are
    labelled by framing; anything else groups by the folder it was found in (one ``--out`` of
    ``attnprobe capture`` per input file) and its question id if any. ``folder``: the capture's
    parent folder relative to the report root ("" or None at the top)."""
    tm = meta.get("trajectory_meta") if isinstance(meta.get("trajectory_meta"), dict) else {}
    tid = str(meta.get("trajectory_id", "?"))
    parts = [folder] if folder and folder != "." else []
    ibis = tm.get("ibis")
    if isinstance(ibis, dict) and ibis.get("item_id") is not None:
        parts.append(f"IBIS item {ibis['item_id']}")
        framing = str(ibis.get("framing") or meta.get("framing") or tid)
        return " · ".join(parts), framing, (framing,)
    if tm.get("run_id") is not None:
        parts.append(f"run {tm['run_id']}")
    if tm.get("question_id") is not None:
        parts.append(f"question {tm['question_id']}")
    if tm.get("run_id") is not None and tm.get("agent") is not None:
        idx = tm.get("call_index")  # the run's call order (sorts the index); the label is the call's own id
        return (" · ".join(parts), tid.rsplit("/", 1)[-1] or str(tm["agent"]),
                (idx if isinstance(idx, int) else 1 << 62, tid))
    return " · ".join(parts) or "captures", tid, (tid,)


def build_report(results: list[CaptureResult], title: str = "attnprobe report",
                 skipped: list[tuple[str, str]] | None = None, folders: list[str] | None = None,
                 sections: Sequence[Section] = ()) -> str:
    """The HTML page: overall numbers per model variant, then an index of every capture by group
    (:func:`capture_group`) linking to its section; sections are collapsed (``<details>``) so a
    folder of 125 captures stays a page one can scroll. ``skipped``: (folder, reason) of captures
    that could not be read or were left out; listed in a table so a reader knows the overall numbers
    leave them out. ``folders``: each result's parent folder relative to the report root, for grouping.
    ``sections``: other studies' parts (:class:`Section`), shown after the overall numbers."""
    if not results and not sections:
        raise AttnprobeError("no capture results to report on")
    by_model: dict[str, list[CaptureResult]] = {}
    for r in results:
        by_model.setdefault(variant_label(r.meta), []).append(r)
    overall, eligible = [], 0
    for model, rs in by_model.items():
        h = headline(rs)
        eligible += h["steps"]
        rows = [("trajectories", len(rs)), (f"reasoning steps with ≥{h['min_past']} past turns", h["steps"])]
        overall.append((model, rows + [(label, format_ci(h[key], signed=False)) for label, key in HEADLINE_ROWS]))
    if skipped:
        overall.append((f"Skipped: {len(skipped)} unreadable capture folder{'s' if len(skipped) > 1 else ''} "
                        "(not in any number above)", list(skipped)))
    decay = None
    if eligible:  # no step with enough past turns: no curve to draw (an empty plot read as zero attention)
        decay = decay_figure({model: decay_curves(rs) for model, rs in by_model.items()},
                             ("reasoning", "tool_call", "observation"))
        decay.update_layout(title="Decay curves (20 bins, reasoning steps with ≥5 past turns)")
    groups: dict[str, list[tuple[tuple, dict]]] = {}
    for i, r in enumerate(results):
        m = r.meta
        group, label, key = capture_group({**m, "trajectory_id": r.trajectory_id}, folders[i] if folders else None)
        steps = sum(q.kind == "reasoning" for q in r.queries)
        figs = steps > 0 and r.num_turns > 1
        queries = describe_queries(r.queries)
        section = {"anchor": f"c{i}", "id": r.trajectory_id, "label": label,
                   "summary": f"{r.num_turns} turn{'s' if r.num_turns != 1 else ''}, {queries}",
                   "info": [
                       ("trajectory", r.trajectory_id), ("model", variant_label(m)),
                       ("tokens / turns", f"{len(r.input_ids)} / {r.num_turns}"), ("queries", queries),
                       ("rendering", m.get("rendering")), ("chat template hash", m.get("chat_template_hash")),
                       ("chunk size", m.get("chunk_size")),
                       ("layers scored", f"{len(r.layers)} of {m.get('num_model_layers')}"),
                       ("framing", m.get("framing"))],
                   "heatmap": _html(heatmap_figure(heatmap(r), r.turn_texts())) if figs else None,
                   "steps": _html(step_breakdown_figure(step_breakdown(r)["steps"])) if figs else None,
                   "no_figures": None if figs else (
                       "No heatmap: it needs reasoning-step queries, and this capture has none." if not steps else
                       "No heatmap: a single turn has no past turns.")}
        groups.setdefault(group, []).append((key, section))
    index = [{"anchor": f"g{gi}", "name": name, "sections": [s for _, s in sorted(items, key=lambda x: x[0])]}
             for gi, (name, items) in enumerate(groups.items())]
    return _template().render(title=title, version=__version__, n_results=len(results), overall=overall,
                              decay_figure=_html(decay, plotlyjs=True) if decay is not None else "",
                              plotlyjs="" if decay is not None or not results else _plotlyjs(), groups=index,
                              grey_note=HEATMAP_GREY_NOTE, sections=list(sections))


def _plotlyjs() -> str:
    """plotly.js inline, for a page whose heatmaps follow no decay figure (which otherwise carries it)."""
    from plotly.offline import get_plotlyjs

    return f'<script type="text/javascript">{get_plotlyjs()}</script>'


def _html(fig, plotlyjs: bool = False) -> str:
    return fig.to_html(full_html=False, include_plotlyjs=plotlyjs)


def unusable(result: CaptureResult) -> str | None:
    """Why a capture that loaded cannot enter the numbers, or None: non-finite scores (one NaN would
    make every overall mean NaN), or scores the analyses cannot use (tried on this capture alone)."""
    for name in ("segment_attention", "layer_head_attention", "token_attention"):
        arr = getattr(result, name)
        if arr is not None and np.issubdtype(np.asarray(arr).dtype, np.floating):
            bad = int(np.size(arr) - np.count_nonzero(np.isfinite(arr)))
            if bad:
                return f"scores.safetensors: {bad} NaN or infinite value{'s' if bad > 1 else ''} in {name}; left out"
    try:
        headline([result])
        decay_curves([result])
        if any(q.kind == "reasoning" for q in result.queries) and result.num_turns > 1:  # as build_report draws
            heatmap(result)
            step_breakdown(result)
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        return f"scores do not fit its segments and queries ({type(exc).__name__}: {exc}); left out"
    return None


def write_report(root: Path, out: Path | None = None, extra: Sequence[ExtraSection] = ()) -> Path:
    """Report over every capture below ``root``: an unreadable or unusable one is skipped (logged, and
    listed on the page with its reason) instead of aborting the report or blanking its numbers.
    ``extra``: sections other studies add (:class:`ExtraSection`; the CLI passes the counterfactual one)."""
    root = Path(root)
    if not root.is_dir():
        raise AttnprobeError(f"{root}: not a folder" if root.exists() else f"{root}: folder not found")
    out = Path(out) if out else root / "report.html"
    ensure_writable_file(out, "report file")
    skipped: list[tuple[str, str]] = []
    owned: dict[str, list[Path]] = {x.marker: [] for x in extra}
    results, folders = [], []
    for folder in find_results(root, skipped, owned):
        try:
            result = CaptureResult.load(folder)
        except AttnprobeError as exc:
            log.warning("skipping %s", exc)
            skipped.append((str(folder), str(exc)))
            continue
        why = unusable(result)
        if why is not None:
            log.warning("skipping %s: %s", folder, why)
            skipped.append((str(folder), f"{folder}/{why}"))
            continue
        results.append(result)
        folders.append(folder.relative_to(root).parent.as_posix())
    sections = []
    for x in extra:
        section = x.build(root, owned[x.marker], skipped)
        if section is not None and section.parts:
            sections.append(section)
    if not results and not sections:
        why = f"; {len(skipped)} unreadable: {skipped[0][1]}" if skipped else " (run 'attnprobe capture' first)"
        raise AttnprobeError(f"{root}: no readable capture results found{why}")
    atomic_write_text(out, build_report(results, skipped=skipped, folders=folders, sections=sections))
    if skipped:
        log.warning("report written without %d unreadable capture folder(s), listed in the report", len(skipped))
    return out
