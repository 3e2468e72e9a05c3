"""``attnprobe ibis {all,run,capture,report,check}`` and ``attnprobe compare``.

Exit codes follow attnprobe.cli: 0 ok, 1 some items failed (the rest were written; rerun to
retry them), 2 bad input, 3 model not available locally, 130 interrupted.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from attnprobe.cli.options import (
    add_capture_options,
    add_cluster_options,
    add_generation_options,
    add_hidden_alias,
    add_model_options,
    add_options,
    add_output_options,
    positive_int,
)
from attnprobe.studies.ibis.behaviour import DEFAULT_MAX_NEW_TOKENS
from attnprobe.studies.ibis.layout import CompareLayout, ModelFolderLayout
from attnprobe.studies.ibis.pipeline import PROTOCOL_HELP, IbisOptions


def _add_items(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("items")
    add_options(g, IbisOptions, ("items", "limit", "ids", "framings", "protocol", "reminder"))


def _add_output(p: argparse.ArgumentParser, *, force_help: str | None = None, progress: bool = True):
    g = add_output_options(p, out=False, force=force_help is not None, force_help=force_help or "",
                           progress=progress)
    add_options(g, IbisOptions, ("results", "folder"))
    return g


def _add_generation(p):
    g = add_generation_options(p, max_new_tokens=DEFAULT_MAX_NEW_TOKENS, backend_alias=True)
    add_options(g, IbisOptions, ("no_call_tokens", "batch_size"))
    add_hidden_alias(p, "--batch-size", "batch_size", new="--prompts-per-batch", type=positive_int)


def _add_capture(p):
    add_capture_options(p, only=("share_prefixes",))


def _add_report(p):
    from attnprobe.studies.ibis.options import ReportOptions

    add_options(p.add_argument_group("report"), ReportOptions)


def register(subparsers) -> None:
    ibis = subparsers.add_parser(
        "ibis", help="inertia-bias benchmark: behaviour and attention per framing (agentic/observer/direct)",
        description="IBIS: does the model judge search results worse when the search was its own action, and "
                    "where does its attention go? 'all' runs the whole pipeline; run/capture/report do one stage; "
                    "check validates items. Results go to one folder per model (layout: docs/ibis.md).")
    sub = ibis.add_subparsers(dest="ibis_action", metavar="ACTION")
    p_all = sub.add_parser(
        "all", help="run + capture + report in one command",
        description="Generate the next action for every item and framing, capture attention at the decision "
                    "token, and write the report, item group by item group (an interrupted run has both stages "
                    "for every finished item; rerun to resume). Generation can go through an endpoint "
                    "(--generator openai); capture always uses the in-process --model.")
    _add_items(p_all)
    add_model_options(p_all)
    _add_generation(p_all)
    _add_capture(p_all)
    add_cluster_options(p_all)
    _add_report(p_all)
    _add_output(p_all, force_help="redo finished items in every stage instead of resuming")
    p_all.set_defaults(func=cmd_all)
    p_run = sub.add_parser(
        "run", help="generate and parse the next action for every item and framing",
        description="Greedy generation of the model's next message for every (item, framing), parsed into a "
                    "decision (web_search / visit_page / answer) and appended to FOLDER/decisions.jsonl. "
                    "Resumable: finished pairs are skipped, failures are retried on the next run.")
    _add_items(p_run)
    add_model_options(p_run)
    _add_generation(p_run)
    add_cluster_options(p_run)
    _add_output(p_run, force_help="redo finished items instead of resuming")
    p_run.set_defaults(func=cmd_run)
    p_cap = sub.add_parser(
        "capture", help="capture attention at the decision position for every item and framing",
        description="Render every (item, framing) with --model's chat template, capture exact attention from the "
                    "decision token to every earlier token and aggregate it by category into "
                    "FOLDER/attention.safetensors. Resumable.")
    _add_items(p_cap)
    add_model_options(p_cap)
    _add_capture(p_cap)
    add_cluster_options(p_cap)
    _add_output(p_cap, force_help="recapture finished items (old name: --force-capture)")
    add_hidden_alias(p_cap, "--force-capture", "force", new="--force", action="store_true")
    p_cap.set_defaults(func=cmd_capture)
    p_rep = sub.add_parser(
        "report", help="metrics.json, report.md and report.html from a model folder",
        description="Behavioural metrics (accuracy, inertia gap, forced choice) and attentional metrics (gap, "
                    "heads) with bootstrap CIs from a model folder written by run/capture; prints the markdown "
                    "report. The folder is --folder, or <--results>/<bundled model name> by default.")
    _add_report(p_rep)
    _add_output(p_rep, progress=False)
    add_options(p_rep, IbisOptions, ("protocol", "reminder"), helps={
        "protocol": PROTOCOL_HELP + " Here: whose default folder to report (ignored with --folder)."})
    p_rep.set_defaults(func=cmd_report)
    p_check = sub.add_parser(
        "check", help="validate an items file and the framing invariants for a model's template",
        description="Load and validate the items (errors name file, line and field) and check on the rendered "
                    "token ids that the framings differ only where they should for --model's chat template. "
                    "Exit code 2 if any item breaks an invariant.")
    _add_items(p_check)
    add_model_options(p_check)
    p_check.set_defaults(func=cmd_check)
    ibis.set_defaults(func=lambda a: (ibis.print_help(), 2)[1])

    cmp_ = subparsers.add_parser(
        "compare", help="behavioural and attentional IBIS gaps side by side across model folders",
        description="Reads metrics.json from every model folder given (or every model folder inside a results "
                    "root) and writes compare.md, compare.json and compare.html (plotly).")
    from attnprobe.studies.ibis.options import CompareOptions

    add_options(cmp_, CompareOptions, ("folders",))
    g = add_output_options(cmp_, out_type=Path, out_default=Path("results") / "ibis_compare",
                           out_help="output folder (default results/ibis_compare)", force=False, progress=False)
    add_options(g, CompareOptions, ("plotlyjs",))
    cmp_.set_defaults(func=cmd_compare)


# ------------------------------------------------------------------ helpers
def ibis_options(args):
    """The options record of the pipeline (:class:`~attnprobe.studies.ibis.pipeline.IbisOptions`); a
    command without a stage's options keeps that stage's defaults."""
    from attnprobe.studies.ibis.pipeline import IbisOptions

    a = vars(args)
    keep = {k: a[k] for k in ("items", "ids", "limit", "results", "folder", "base_url", "served_model", "model",
                              "dtype", "protocol", "reminder", "framings", "max_new_tokens", "batch_size",
                              "no_call_tokens", "chunk_size", "force") if a.get(k) is not None}
    return IbisOptions(**keep, generator=a.get("generator") or "transformers",
                       share_prefixes=a.get("share_prefixes", True))


def _say(line: str) -> None:
    print(line, file=sys.stderr)


def _run(args, stages: tuple[str, ...], **executor) -> int:
    """The IBIS study (:data:`~attnprobe.studies.ibis.study.IBIS`) with these stages through the one driver."""
    from attnprobe.cli.adapter import run_command
    from attnprobe.studies.ibis.study import IBIS, IbisRun

    report = None
    if stages == ("run", "capture"):
        from attnprobe.io.options import from_args
        from attnprobe.studies.ibis.options import ReportOptions

        report = from_args(ReportOptions, args)
    return run_command(IBIS, IbisRun(ibis_options(args), stages, report=report, say=_say), args, **executor)


def cmd_run(args) -> int:
    refuse = ("ibis run --generator openai generates through the endpoint, which already serves the generation "
              "(drop --ray, or scale the server)")
    return _run(args, ("run",), generate=True, endpoint_refuses_ray=refuse, timeout=600.0)


def cmd_capture(args) -> int:
    return _run(args, ("capture",))


def cmd_report(args) -> int:
    from attnprobe.studies.ibis.pipeline import target
    from attnprobe.studies.ibis.report import markdown_report, write_report

    folder = target(ibis_options(args)).folder
    m = write_report(folder, n_boot=args.bootstrap, seed=args.seed, n_perm=args.permutations,
                     plotlyjs=True if args.plotlyjs == "inline" else "cdn")
    print(markdown_report(m))
    print(f"ibis report -> {ModelFolderLayout(folder).report_html}", file=sys.stderr)
    return 0


def cmd_all(args) -> int:
    """Behaviour and capture item group by item group, then aggregate and report
    (:func:`~attnprobe.studies.ibis.pipeline.all_steps`). One executor per need for the whole command (a chat
    for behaviour, the model for capture: :func:`attnprobe.cli.adapter.open_pair`), so a model (or each Ray
    replica) loads once."""
    if args.generator == "openai":
        _say("ibis all: generating through the endpoint, capturing with the in-process model given by --model")
    return _run(args, ("run", "capture"), pair=True, timeout=600.0)


def cmd_check(args) -> int:
    from attnprobe.capture.models import load_model
    from attnprobe.studies.ibis.framings import check_invariants
    from attnprobe.studies.ibis.pipeline import select_items

    items = select_items(ibis_options(args))
    loaded = load_model(args.model, dtype=args.dtype, device=args.device)
    bad = 0
    for it in items:
        res = check_invariants(loaded.tokenizer, it, protocol=ibis_options(args).ibis_protocol)
        if not res["ok"]:
            bad += 1
            print(f"{it.id}: " + "; ".join(res["problems"]))
    print(f"{len(items)} items valid; framing invariants hold for {len(items) - bad} of them "
          f"(renderings: {res['rendering']})")
    return 2 if bad else 0


def cmd_compare(args) -> int:
    from attnprobe.studies.ibis.report import compare

    rows, table = compare(args.folders, args.out, plotlyjs=True if args.plotlyjs == "inline" else "cdn")
    print(table)
    print(f"compare -> {CompareLayout(args.out).page_html}", file=sys.stderr)
    return 0
