"""``attnprobe ibis {all,run,capture,report,check}`` and ``attnprobe compare``.

Exit codes follow attnprobe.cli: 0 ok, 1 some items failed (the rest were written; rerun to
retry them), 2 bad input, 3 model not available locally, 130 interrupted.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from attnprobe.cli.options import (
    add_capture_options,
    add_cluster_options,
    add_generation_options,
    add_hidden_alias,
    add_model_options,
    add_output_options,
    cluster_free,
    non_negative_int,
    positive_int,
)
from attnprobe.studies.ibis.behaviour import DEFAULT_MAX_NEW_TOKENS, DEFAULT_NO_CALL_TOKENS
from attnprobe.studies.ibis.framings import FRAMINGS, PROTOCOLS, REMINDERS

DEFAULT_ITEMS_NAME = "ibis_items.jsonl"
DEFAULT_RESULTS = Path("results") / "ibis"


def _add_items(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("items")
    g.add_argument("--items", type=Path, default=None,
                   help=f"IBIS items (JSON Lines; default: the shipped set {DEFAULT_ITEMS_NAME})")
    g.add_argument("--limit", type=positive_int, default=None, help="use only the first N items")
    g.add_argument("--ids", nargs="+", default=None, help="use only these item ids")
    g.add_argument("--framings", nargs="+", default=list(FRAMINGS), choices=FRAMINGS,
                   help="framings to run (default: all of them)")
    _add_protocol(g)


def _add_protocol(g, extra: str = "") -> None:
    g.add_argument("--protocol", choices=PROTOCOLS, default="paper",
                   help="paper (default): seed 001 appendix E's layouts, the query never shown to the observer; "
                        "matched: the observer and direct framings also show the query, for attention to the same "
                        "query tokens (docs/methods.md). A model folder holds one protocol." + extra)
    g.add_argument("--reminder", choices=REMINDERS, default=None,
                   help="listing: each framing's reminder exactly as seed 001 appendix E prints it (the paper "
                        "protocol's default); identical: one reminder in every framing, as the appendix prose "
                        "says (the matched protocol's default). Recorded in run.json and the report")


def _add_output(p: argparse.ArgumentParser, *, force_help: str | None = None, progress: bool = True):
    g = add_output_options(p, out=False, force=force_help is not None, force_help=force_help or "",
                           progress=progress)
    g.add_argument("--results", type=Path, default=DEFAULT_RESULTS,
                   help="results root; each model gets <results>/<model name>/ (default: results/ibis)")
    g.add_argument("--folder", type=Path, default=None,
                   help="the model folder itself (overrides --results and the name derived from the model)")
    return g


def _add_generation(p):
    g = add_generation_options(p, max_new_tokens=DEFAULT_MAX_NEW_TOKENS, backend_alias=True)
    g.add_argument("--no-call-tokens", type=non_negative_int, default=DEFAULT_NO_CALL_TOKENS,
                   help=f"in process: stop a reply after this many tokens without a tool call opening (default "
                        f"{DEFAULT_NO_CALL_TOKENS}; 0 = never), so one reply never holds its batch for the whole "
                        "token limit; recorded and compared on resume")
    g.add_argument(
        "--batch-size", type=positive_int, default=12,
        help="prompts generated together (transformers; left-padded batch, same greedy output; default 12)")


def _add_capture(p, *, force_capture: bool):
    g = add_capture_options(p, only=("share_prefixes",))
    if force_capture:
        g.add_argument("--force-capture", action="store_true", help="recapture finished items (capture stage only)")


def _add_report(p):
    g = p.add_argument_group("report")
    g.add_argument("--bootstrap", type=positive_int, default=10000, help="bootstrap resamples for CIs (default 10000)")
    g.add_argument("--seed", type=non_negative_int, default=0, help="random seed of the bootstrap and permutations")
    g.add_argument("--permutations", type=non_negative_int, default=200, help="query-group permutations for the flip-AUC p-values (fold-mean AUC)")
    add_plotlyjs_option(g, "report.html")


def add_plotlyjs_option(g, page: str) -> None:
    g.add_argument("--plotlyjs", choices=("inline", "cdn"), default="inline",
                   help=f"embed plotly.js in {page} (works offline; default) or load it from the CDN")


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
    _add_capture(p_all, force_capture=True)
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
    _add_capture(p_cap, force_capture=False)
    add_cluster_options(p_cap)
    _add_output(p_cap, force_help="recapture finished items (old name: --force-capture)")
    add_hidden_alias(p_cap, "--force-capture", "force", action="store_true")
    p_cap.set_defaults(func=cmd_capture)
    p_rep = sub.add_parser(
        "report", help="metrics.json, report.md and report.html from a model folder",
        description="Behavioural metrics (accuracy, inertia gap, forced choice) and attentional metrics (gap, "
                    "heads) with bootstrap CIs from a model folder written by run/capture; prints the markdown "
                    "report. The folder is --folder, or <--results>/<bundled model name> by default.")
    _add_report(p_rep)
    _add_output(p_rep, progress=False)
    _add_protocol(p_rep, " Here: whose default folder to report (ignored with --folder).")
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
    cmp_.add_argument("folders", nargs="+", type=Path, help="model folders or results roots")
    g = add_output_options(cmp_, out_type=Path, out_default=Path("results") / "ibis_compare",
                           out_help="output folder (default results/ibis_compare)", force=False, progress=False)
    add_plotlyjs_option(g, "compare.html")
    cmp_.set_defaults(func=cmd_compare)


# ------------------------------------------------------------------ helpers
def _items(args):
    """The items the options select (--items, --ids, --limit)."""
    from attnprobe.studies.ibis.items import ItemError, load_items

    items = load_items(_items_path(args))
    if args.ids:
        known = {it.id for it in items}
        bad = [i for i in args.ids if i not in known]
        if bad:
            raise ItemError(f"unknown item ids: {', '.join(bad)}", path=str(_items_path(args)), field="id")
        items = [it for it in items if it.id in set(args.ids)]
    if args.limit is not None:
        items = items[: args.limit]
    return items


def _items_path(args) -> Path:
    if args.items is not None:
        return args.items
    from attnprobe.resources import data_path

    return data_path(DEFAULT_ITEMS_NAME)


@dataclass(frozen=True)
class Target:
    """Where an IBIS command writes (the model folder) and the model it names."""

    name: str
    folder: Path


def _target(args) -> Target:
    from attnprobe.studies.ibis.folder import model_folder, model_name

    generator = getattr(args, "backend", "transformers")  # `ibis report`/`capture` have no generator
    if generator == "openai" and not (args.served_model and args.base_url):
        raise ValueError("--generator openai needs --base-url and --served-model")
    name = model_name(getattr(args, "model", "default"), served_model=args.served_model if generator == "openai"
                      else None)
    folder = args.folder or model_folder(args.results, name, dtype=getattr(args, "dtype", "float32"),
                                         protocol=getattr(args, "protocol", "paper"))
    return Target(name, folder)


def _prepare(args, target: Target, items, generator: str) -> None:
    from attnprobe.studies.ibis.folder import prepare_folder, variant

    endpoint = generator == "openai"
    v = variant(dtype=args.dtype, model=args.model, endpoint=args.base_url if endpoint else None,
                served_model=args.served_model if endpoint else None)
    prepare_folder(target.folder, items, name=target.name, protocol=args.protocol, this_variant=v,
                   items_source=str(_items_path(args)), reminder=args.reminder)


def _generation_executor(args):
    """Where generation runs: the executor of the model options (this process or Ray replicas), or an
    endpoint's client here (--generator openai; ``ibis all`` then still captures on the cluster)."""
    from attnprobe.cli.options import executor, make_generator

    def load():
        return make_generator(args, timeout=600.0)

    if args.backend == "openai":
        from attnprobe.execution.local import LocalExecutor

        return LocalExecutor(load, progress=not args.no_progress)
    return executor(args, load=load)


def _stage_run(args, target: Target, items, ex) -> int:
    from attnprobe.studies.ibis.folder import invariants, update_run
    from attnprobe.studies.ibis.framings import resolve_reminder
    from attnprobe.studies.ibis.jobs import BehaviourJob

    _prepare(args, target, items, args.backend)
    # built before the model loads: it refuses a resume with other generation settings
    job = BehaviourJob(target.folder, items, framings=args.framings, max_tokens=args.max_new_tokens,
                       protocol=args.protocol, batch_size=args.batch_size, force=args.force, reminder=args.reminder,
                       no_call_tokens=(args.no_call_tokens or None) if args.backend != "openai" else None)
    inv = ex.call(invariants, items, args.protocol, args.reminder)
    counts = ex.run(job)
    counts = {"done_before": counts["done_before"], "decided": counts["done"], "failed": counts["failed"]}
    update_run(target.folder, "behaviour", {"backend": args.backend, "base_url": args.base_url,
                                            "model_spec": args.model, "max_new_tokens": args.max_new_tokens,
                                            "reminder": resolve_reminder(args.protocol, args.reminder),
                                            "no_call_tokens": job.no_call_tokens,
                                            "decoding": "greedy", "batch_size": args.batch_size,
                                            "framings": args.framings, "invariants": inv, **counts})
    from attnprobe.execution.counts import RunCounts

    done = RunCounts(counts["done_before"], counts["decided"], counts["failed"])
    print(done.line("ibis run", done="decided", to=target.folder / "decisions.jsonl"), file=sys.stderr)
    return done.exit_code


def _stage_capture(args, target: Target, items, ex, *, aggregate_now: bool = True) -> int:
    from attnprobe.io.settings import check_settings
    from attnprobe.studies.ibis.attention import aggregate
    from attnprobe.studies.ibis.folder import invariants, update_run
    from attnprobe.studies.ibis.framings import resolve_reminder
    from attnprobe.studies.ibis.jobs import AttentionJob

    if not (target.folder / "items.jsonl").is_file():
        _prepare(args, target, items, "transformers")
    force = args.force or getattr(args, "force_capture", False)
    # finished captures are skipped whatever made them: other capture options are refused (before the model loads)
    check_settings(target.folder, "ibis capture", {"model": args.model, "dtype": args.dtype, "protocol": args.protocol,
                                                   "reminder": resolve_reminder(args.protocol, args.reminder),
                                                   "chunk_size": args.chunk_size}, force=force)
    inv = ex.call(invariants, items, args.protocol, args.reminder)
    job = AttentionJob(target.folder, items, framings=FRAMINGS, chunk_size=args.chunk_size, protocol=args.protocol,
                       force=force, reminder=args.reminder, share_prefixes=args.share_prefixes)
    counts = ex.run(job)
    counts = {"done_before": counts["done_before"], "captured": counts["done"], "failed": counts["failed"]}
    index = aggregate(items, target.folder, protocol=args.protocol, reminder=args.reminder) if aggregate_now else None
    update_run(target.folder, "attention", {"model_spec": args.model, "chunk_size": args.chunk_size,
                                            "invariants": inv, **counts,
                                            "aggregated_items": len(index["items"]) if index else None})
    from attnprobe.execution.counts import RunCounts

    done = RunCounts(counts["done_before"], counts["captured"], counts["failed"])
    print(done.line("ibis capture", done="captured", to=target.folder / "attention.safetensors"), file=sys.stderr)
    return done.exit_code


# ------------------------------------------------------------------ commands
def cmd_run(args) -> int:
    from attnprobe.io import hold_dir_lock

    items, target = _items(args), _target(args)
    if args.backend == "openai":  # an endpoint already serves many requests: no replicas to run
        cluster_free(args, "ibis run --generator openai generates through the endpoint, which already serves "
                           "the generation (drop --ray, or scale the server)")
    with hold_dir_lock(target.folder, "IBIS model folder"), _generation_executor(args) as ex:
        return _stage_run(args, target, items, ex)


def cmd_capture(args) -> int:
    from attnprobe.cli.options import executor
    from attnprobe.io import hold_dir_lock

    items, target = _items(args), _target(args)
    with hold_dir_lock(target.folder, "IBIS model folder"), executor(args) as ex:
        return _stage_capture(args, target, items, ex)


def cmd_report(args) -> int:
    from attnprobe.studies.ibis.report import markdown_report, write_report

    folder = _target(args).folder
    m = write_report(folder, n_boot=args.bootstrap, seed=args.seed, n_perm=args.permutations,
                     plotlyjs=True if args.plotlyjs == "inline" else "cdn")
    print(markdown_report(m))
    print(f"ibis report -> {folder / 'report.html'}", file=sys.stderr)
    return 0


def cmd_all(args) -> int:
    """Behaviour and capture item group by item group (so an interrupted run has both for every
    finished item), then aggregate and report. One executor per stage for the whole command, so a
    model (or each Ray replica) loads once."""
    from attnprobe.io import hold_dir_lock

    items, target = _items(args), _target(args)
    with hold_dir_lock(target.folder, "IBIS model folder"):
        return _all_locked(args, items, target)


def _all_locked(args, items, target: Target) -> int:
    from attnprobe.cli.options import executor
    from attnprobe.studies.ibis.attention import aggregate
    from attnprobe.studies.ibis.folder import update_run

    if args.backend == "openai":
        print("ibis all: generating through the endpoint, capturing with the in-process model given by --model",
              file=sys.stderr)
    # A group is what one generation batch holds; an executor that shards (Ray) gets the whole set.
    rc = 0
    with _generation_executor(args) as gen, executor(args) as cap:
        per = len(items) if getattr(gen, "shards", False) or getattr(cap, "shards", False) else \
            max(1, args.batch_size // max(1, len(args.framings)))
        for start in range(0, len(items), per):
            group = items[start:start + per]
            rc = max(rc, _stage_run(args, target, group, gen))
            rc = max(rc, _stage_capture(args, target, group, cap, aggregate_now=False))
            print(f"ibis all: {min(start + per, len(items))}/{len(items)} items done", file=sys.stderr)
    index = aggregate(items, target.folder, protocol=args.protocol, reminder=args.reminder)
    update_run(target.folder, "aggregate", {"items": len(index["items"]) if index else 0})
    cmd_report(args)
    return rc


def cmd_check(args) -> int:
    from attnprobe.capture.models import load_model
    from attnprobe.studies.ibis.framings import check_invariants

    items = _items(args)
    loaded = load_model(args.model, dtype=args.dtype, device=args.device)
    bad = 0
    for it in items:
        res = check_invariants(loaded.tokenizer, it, protocol=args.protocol, reminder=args.reminder)
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
    print(f"compare -> {args.out / 'compare.html'}", file=sys.stderr)
    return 0
