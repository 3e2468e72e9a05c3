"""Self-contained HTML report (plotly figures, plotly.js embedded once) over capture folders;
the page is the Jinja template ``templates/report.html``."""

from __future__ import annotations

import logging
import os
from functools import cache
from pathlib import Path

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


COUNTERFACTUAL_RECORD = "record.json"  # attnprobe.counterfactual.run.RECORD_FILE (that module needs torch)


def find_results(root: Path, skipped: list[tuple[str, str]] | None = None,
                 counterfactual_roots: set[Path] | None = None) -> list[Path]:
    """Every capture folder below root (a folder whose meta.json has a trajectory_id).

    Counterfactual step folders (``<run>/<trajectory>/<policy>/step_*/record.json``) are not entered;
    their run folder is added to ``counterfactual_roots`` (reported in a section of its own).
    Dot-folders are not entered (AtomicDir's work folders of an interrupted save, ``.git``); symlinked
    folders are not followed. A meta.json that is unreadable, over :data:`attnprobe.io.MAX_JSON_BYTES`
    (checked before reading) or not JSON is appended to ``skipped`` as (path, reason) and logged; one
    that is valid JSON without our keys belongs to another tool and is passed over quietly.
    """
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not is_work_dir(d))
        if COUNTERFACTUAL_RECORD in filenames:  # a counterfactual step: its two captures are reported there
            dirnames[:] = []
            if counterfactual_roots is not None and len(Path(dirpath).relative_to(root).parts) >= 3:
                counterfactual_roots.add(Path(dirpath).parents[2])
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
        idx = tm.get("call_index")
        return (" · ".join(parts), f"{tm['agent']} #{idx}" if idx is not None else str(tm["agent"]),
                (idx if isinstance(idx, int) else 1 << 62, tid))
    return " · ".join(parts) or "captures", tid, (tid,)


CF_QUERIES = (("decision", "at the decision position (the token that predicts the step's action)"),
              ("reasoning", "at the step's reasoning start (seed 002's query)"))
CF_LEGEND = ("Per policy, over every step in the folder: the mean share of attention the removed spans held in "
             "the original context (percent, 95% bootstrap interval over steps), the part of it on observation "
             "content, where the mass went in the counterfactual (change per destination group, percentage "
             "points; the changes sum to the removed mass), how often the next action changed (Wilson interval; "
             "'not run' without --actions), and prompt tokens saved. Steps of one trajectory are not "
             "independent: with few trajectories read the intervals as descriptive. Definitions: "
             "docs/counterfactual.md.")


def counterfactual_sections(root: Path, runs: set[Path], skipped: list[tuple[str, str]]) -> list[dict]:
    """One section per counterfactual run folder: the summary tables of :mod:`attnprobe.counterfactual.summary`.
    A record that cannot be read is added to ``skipped`` and left out of the numbers."""
    from attnprobe.counterfactual.summary import TABLE_HEAD, summarize, table_rows

    sections = []
    for i, run in enumerate(sorted(runs)):
        records = []
        for path in sorted(run.glob(f"*/*/step_*/{COUNTERFACTUAL_RECORD}")):
            try:
                rec = load_json(path)
                if not isinstance(rec, dict) or "policy" not in rec or "queries" not in rec:
                    raise AttnprobeError(f"{path}: not a counterfactual step record")
            except AttnprobeError as exc:
                log.warning("skipping %s", exc)
                skipped.append((str(path.parent), str(exc)))
                continue
            records.append(rec)
        if not records:
            continue
        try:
            summary = summarize(records)
        except (KeyError, TypeError, ValueError) as exc:
            log.warning("skipping counterfactual run %s: %s", run, exc)
            skipped.append((str(run), f"records do not summarise: {type(exc).__name__}: {exc}"))
            continue
        rel = run.relative_to(root).as_posix()
        sections.append({
            "anchor": f"cf{i}", "name": "." if rel == "." else rel, "head": TABLE_HEAD,
            "info": [("steps", len(records)), ("trajectories", len({r["trajectory_id"] for r in records})),
                     ("policies", ", ".join(summary))],
            "tables": [(title, table_rows(summary, q)) for q, title in CF_QUERIES]})
    return sections


def build_report(results: list[CaptureResult], title: str = "attnprobe report",
                 skipped: list[tuple[str, str]] | None = None, folders: list[str] | None = None,
                 counterfactual: list[dict] | None = None) -> str:
    """The HTML page: overall numbers per model variant, then an index of every capture by group
    (:func:`capture_group`) linking to its section; sections are collapsed (``<details>``) so a
    folder of 125 captures stays a page one can scroll. ``skipped``: (folder, reason) of captures
    that could not be read; listed in a table so a reader knows the overall numbers leave them out.
    ``folders``: each result's parent folder relative to the report root, for grouping."""
    if not results and not counterfactual:
        raise AttnprobeError("no capture results to report on")
    by_model: dict[str, list[CaptureResult]] = {}
    for r in results:
        by_model.setdefault(variant_label(r.meta), []).append(r)
    overall = []
    for model, rs in by_model.items():
        h = headline(rs)
        rows = [("trajectories", len(rs)), (f"reasoning steps with ≥{h['min_past']} past turns", h["steps"])]
        overall.append((model, rows + [(label, format_ci(h[key], signed=False)) for label, key in HEADLINE_ROWS]))
    if skipped:
        overall.append((f"Skipped: {len(skipped)} unreadable capture folder{'s' if len(skipped) > 1 else ''} "
                        "(not in any number above)", list(skipped)))
    decay = None
    if results:
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
                              decay_figure=_html(decay, plotlyjs=True) if decay is not None else "", groups=index,
                              grey_note=HEATMAP_GREY_NOTE, counterfactual=counterfactual or [], cf_legend=CF_LEGEND)


def _html(fig, plotlyjs: bool = False) -> str:
    return fig.to_html(full_html=False, include_plotlyjs=plotlyjs)


def write_report(root: Path, out: Path | None = None) -> Path:
    """Report over every capture below ``root``: an unreadable one is skipped (logged, and listed on
    the page with its reason) instead of aborting the report."""
    root = Path(root)
    if not root.is_dir():
        raise AttnprobeError(f"{root}: not a folder" if root.exists() else f"{root}: folder not found")
    out = Path(out) if out else root / "report.html"
    ensure_writable_file(out, "report file")
    skipped: list[tuple[str, str]] = []
    results, folders, cf_runs = [], [], set()
    for folder in find_results(root, skipped, cf_runs):
        try:
            results.append(CaptureResult.load(folder))
        except AttnprobeError as exc:
            log.warning("skipping %s", exc)
            skipped.append((str(folder), str(exc)))
        else:
            folders.append(folder.relative_to(root).parent.as_posix())
    counterfactual = counterfactual_sections(root, cf_runs, skipped)
    if not results and not counterfactual:
        why = f"; {len(skipped)} unreadable: {skipped[0][1]}" if skipped else " (run 'attnprobe capture' first)"
        raise AttnprobeError(f"{root}: no readable capture results found{why}")
    atomic_write_text(out, build_report(results, skipped=skipped, folders=folders, counterfactual=counterfactual))
    if skipped:
        log.warning("report written without %d unreadable capture folder(s), listed in the report", len(skipped))
    return out
