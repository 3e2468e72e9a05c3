"""``attnprobe ibis {all,run,capture,report,check}`` and ``attnprobe compare``.

Exit codes follow attnprobe.cli: 0 ok, 1 some items failed (the rest were written; rerun to
retry them), 2 bad input, 3 model not available locally, 130 interrupted.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
from pathlib import Path

from attnprobe.cli.options import (
    add_capture_options,
    add_generation_options,
    add_hidden_alias,
    add_model_options,
    add_output_options,
)
from attnprobe.distributed import add_cluster_options
from attnprobe.errors import AttnprobeError
from attnprobe.io import atomic_write_text
from attnprobe.studies.ibis.behaviour import DEFAULT_MAX_NEW_TOKENS
from attnprobe.studies.ibis.framings import FRAMINGS, PROTOCOLS

DEFAULT_ITEMS_NAME = "ibis_items.jsonl"
DEFAULT_RESULTS = Path("results") / "ibis"


def slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("._") or "model"


def _add_items(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("items")
    g.add_argument("--items", type=Path, default=None,
                   help=f"IBIS items (JSON Lines; default: the shipped set {DEFAULT_ITEMS_NAME})")
    g.add_argument("--limit", type=int, default=None, help="use only the first N items")
    g.add_argument("--ids", nargs="+", default=None, help="use only these item ids")
    g.add_argument("--framings", nargs="+", default=list(FRAMINGS), choices=FRAMINGS,
                   help="framings to run (default: all of them)")
    _add_protocol(g)


def _add_protocol(g, extra: str = "") -> None:
    g.add_argument("--protocol", choices=PROTOCOLS, default="paper",
                   help="paper (default): seed 001 appendix E's layouts, the query never shown to the observer; "
                        "matched: the observer and direct framings also show the query, for attention to the same "
                        "query tokens (docs/methods.md). A model folder holds one protocol." + extra)


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
    g.add_argument(
        "--batch-size", type=int, default=12,
        help="prompts generated together (transformers; left-padded batch, same greedy output; default 12)")


def _add_capture(p, *, force_capture: bool):
    g = add_capture_options(p, trajectories=False)
    if force_capture:
        g.add_argument("--force-capture", action="store_true", help="recapture finished items (capture stage only)")


def _add_report(p):
    g = p.add_argument_group("report")
    g.add_argument("--bootstrap", type=int, default=10000, help="bootstrap resamples for CIs (default 10000)")
    g.add_argument("--seed", type=int, default=0, help="random seed of the bootstrap and permutations")
    g.add_argument("--permutations", type=int, default=200, help="query-group permutations for the flip-AUC p-values (fold-mean AUC)")
    g.add_argument("--plotlyjs", choices=("inline", "cdn"), default="inline",
                   help="embed plotly.js in report.html (works offline; default) or load it from the CDN")


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
    g.add_argument("--plotlyjs", choices=("inline", "cdn"), default="inline",
                   help="embed plotly.js in compare.html (works offline; default) or load it from the CDN")
    cmp_.set_defaults(func=cmd_compare)


# ------------------------------------------------------------------ helpers
def _items(args):
    from attnprobe.studies.ibis.items import ItemError, load_items

    if args.items is None:
        from attnprobe.resources import data_path

        args.items = data_path(DEFAULT_ITEMS_NAME)
    items = load_items(args.items)
    if args.ids:
        known = {it.id for it in items}
        bad = [i for i in args.ids if i not in known]
        if bad:
            raise ItemError(f"unknown item ids: {', '.join(bad)}", path=str(args.items), field="id")
        items = [it for it in items if it.id in set(args.ids)]
    if args.limit is not None:
        items = items[: args.limit]
    return items


def _model_name(args) -> str:
    if getattr(args, "backend", "transformers") == "openai":
        if not args.served_model or not args.base_url:
            raise ValueError("--generator openai needs --base-url and --served-model")
        return args.served_model
    model = getattr(args, "model", "default")  # `ibis report` has no model: the bundled model's folder
    if model == "default":
        from attnprobe.capture.models import DEFAULT_NAME

        return DEFAULT_NAME
    return Path(model).stem if model.endswith(".gguf") else Path(model).name or model


def _folder(args, name: str | None = None) -> Path:
    """<results>/<model>[__<dtype>][__matched]: one folder per variant (a dtype other than float32 gets
    its own folder) and protocol, so results of different variants are never mixed."""
    if args.folder:
        return args.folder
    protocol = getattr(args, "protocol", "paper")
    dtype = getattr(args, "dtype", "float32")
    return args.results / (slug(name or _model_name(args)) + ("" if dtype in (None, "float32") else f"__{dtype}")
                           + ("" if protocol == "paper" else f"__{protocol}"))


def _variant(args, backend: str) -> dict:
    """What makes a result a result of *this* model: the dtype, and the weights fingerprint (in process)
    or the endpoint and served model (generation through an OpenAI-compatible server)."""
    from attnprobe.capture.api import weights_hash

    v = {"dtype": getattr(args, "dtype", "float32")}
    if backend == "openai":
        v.update({"endpoint": args.base_url, "served_model": args.served_model})
    else:
        v["weights"] = weights_hash(args.model)
    return v


def _prepare_folder(folder: Path, items, args, name: str, backend: str) -> None:
    """Write items.jsonl (the exact items used), framings.jsonl and run.json into the model folder."""
    from attnprobe._version import __version__
    from attnprobe.io import dumps_line, write_jsonl
    from attnprobe.studies.ibis.framings import build_framing
    from attnprobe.studies.ibis.items import load_items
    from attnprobe.studies.ibis.metrics import read_run

    folder.mkdir(parents=True, exist_ok=True)
    items_text = "".join(dumps_line(it.to_dict()) for it in items)
    old = folder / "items.jsonl"
    if old.is_file() and old.read_text(encoding="utf-8") != items_text:
        prev = {it.id: it.to_dict() for it in load_items(old)}
        changed = [it.id for it in items if it.id in prev and prev[it.id] != it.to_dict()]
        if changed:
            raise ValueError(f"{folder}: items {', '.join(changed[:5])} differ from the ones already run there; use a "
                             f"new --folder or delete the old results")
        merged = {**prev, **{it.id: it.to_dict() for it in items}}
        items_text = "".join(dumps_line(v) for v in merged.values())
    atomic_write_text(old, items_text)
    all_items = load_items(old)
    run_path = folder / "run.json"
    run = read_run(folder)
    done_with = run.get("protocol", "matched" if run else args.protocol)  # folders before protocols: matched
    if done_with != args.protocol:
        raise ValueError(f"{folder} holds a --protocol {done_with} run; this one is --protocol {args.protocol}: use "
                         "another --folder (or the default folder of that protocol)")
    variant = {**run.get("variant", {}), **_variant(args, backend)}
    diffs = [f"{k} was {run['variant'][k]!r}, now {variant[k]!r}" for k in run.get("variant", {})
             if k in _variant(args, backend) and run["variant"][k] != variant[k]]
    if diffs:
        raise ValueError(f"{folder} holds results of another variant ({'; '.join(diffs)}): use another --folder "
                         "(or --results; a dtype other than float32 gets its own default folder)")
    write_jsonl(folder / "framings.jsonl",
                (build_framing(it, fr, args.protocol).to_dict() for it in all_items for fr in FRAMINGS))
    run.update({"model": name, "protocol": args.protocol, "variant": variant, "attnprobe_version": __version__, "items_source": str(args.items),
                "items_sha256": hashlib.sha256(items_text.encode()).hexdigest()[:16]})
    run.setdefault("stages", {})
    atomic_write_text(run_path, json.dumps(run, indent=1))


def _update_run(folder: Path, stage: str, info: dict) -> None:
    from attnprobe.studies.ibis.metrics import read_run

    run_path = folder / "run.json"
    run = read_run(folder)
    run.setdefault("stages", {})[stage] = info
    atomic_write_text(run_path, json.dumps(run, indent=1))


def _check_invariants(tokenizer, items, protocol: str) -> dict:
    from attnprobe.studies.ibis.framings import check_invariants

    res = check_invariants(tokenizer, items[0], protocol=protocol)
    if not res["ok"]:
        raise ValueError("framing invariants broken for this chat template: " + "; ".join(res["problems"]))
    return res


# ------------------------------------------------------------------ commands
def cmd_run(args) -> int:
    from attnprobe.cli.options import make_generator
    from attnprobe.studies.ibis.behaviour import BehaviourBackend, run_behaviour

    items = _items(args)
    name = _model_name(args)
    folder = _folder(args, name)
    _prepare_folder(folder, items, args, name, args.backend)
    if getattr(args, "ray", None) is not None and args.backend == "openai" and not getattr(args, "_pool_shared", False):
        raise AttnprobeError("ibis run --ray runs model replicas in process; with --generator openai the endpoint "
                             "already serves the generation (drop --ray, or scale the server)")
    if getattr(args, "ray", None) is not None and args.backend != "openai":
        own_pool = getattr(args, "_pool", None) is None
        pool = _ray_pool(args)
        try:
            inv = pool.run_on_replica(_invariants_on, items, args.protocol)
            counts = pool.ibis_behaviour(items, folder, framings=args.framings, max_tokens=args.max_new_tokens,
                                         protocol=args.protocol, batch_size=args.batch_size, force=args.force)
        finally:
            if own_pool and not getattr(args, "_pool_shared", False):
                pool.close()
                args._pool = None
    else:
        backend = BehaviourBackend(make_generator(args, timeout=600.0))
        inv = _check_invariants(backend.tokenizer, items, args.protocol) if backend.tokenizer is not None else None
        counts = run_behaviour(backend, items, folder, framings=args.framings, max_tokens=args.max_new_tokens,
                               force=args.force, progress=not args.no_progress, batch_size=args.batch_size,
                               protocol=args.protocol)
    _update_run(folder, "behaviour", {"backend": args.backend, "base_url": args.base_url, "model_spec": args.model,
                                      "max_new_tokens": args.max_new_tokens, "decoding": "greedy",
                                      "batch_size": args.batch_size,
                                      "framings": args.framings, "invariants": inv, **counts})
    print(f"ibis run: {counts['decided']} decided, {counts['done_before']} already done, {counts['failed']} failed "
          f"-> {folder / 'decisions.jsonl'}", file=sys.stderr)
    return 1 if counts["failed"] else 0


def _invariants_on(model, items, protocol):  # runs on a Ray replica (the driver loads no model)
    return _check_invariants(model.tokenizer, items, protocol)


def _ray_pool(args):
    """The Ray replica pool of --ray (reused across the item groups of ``ibis all``), or None."""
    from attnprobe.distributed import ReplicaPool, cluster_from_args

    cluster = cluster_from_args(args)
    if cluster is None:
        return None
    if getattr(args, "_pool", None) is None:
        args._pool = ReplicaPool(args.model, cluster=cluster, dtype=args.dtype, load_options={"device": args.device},
                                 progress=not args.no_progress)
    return args._pool


def cmd_capture(args, aggregate_now: bool = True) -> int:
    from attnprobe.studies.ibis.attention import aggregate, run_attention

    items = _items(args)
    force = args.force or getattr(args, "force_capture", False)
    own_pool = getattr(args, "_pool", None) is None
    pool = _ray_pool(args)
    try:
        if pool is not None:
            name = getattr(args, "_name", None) or _model_name(args)
            folder = _folder(args, name)
            if not (folder / "items.jsonl").is_file():
                _prepare_folder(folder, items, args, name, "transformers")
            inv = pool.run_on_replica(_invariants_on, items, args.protocol)
            counts = pool.ibis_attention(items, folder, framings=FRAMINGS, chunk_size=args.chunk_size, force=force,
                                         protocol=args.protocol)
        else:
            from attnprobe.capture.models import load_model

            loaded = load_model(args.model, dtype=args.dtype, device=args.device)
            folder = _folder(args, getattr(args, "_name", None) or loaded.name)
            if not (folder / "items.jsonl").is_file():
                _prepare_folder(folder, items, args, loaded.name, "transformers")
            inv = _check_invariants(loaded.tokenizer, items, args.protocol)
            counts = run_attention(loaded, items, folder, framings=FRAMINGS, chunk_size=args.chunk_size, force=force,
                                   progress=not args.no_progress, protocol=args.protocol)
    finally:
        if pool is not None and own_pool and not getattr(args, "_pool_shared", False):
            pool.close()
            args._pool = None
    index = aggregate(items, folder, protocol=args.protocol) if aggregate_now else None
    _update_run(folder, "attention", {"model_spec": args.model, "chunk_size": args.chunk_size, "invariants": inv,
                                      **counts, "aggregated_items": len(index["items"]) if index else None})
    print(f"ibis capture: {counts['captured']} captured, {counts['done_before']} already done, {counts['failed']} "
          f"failed -> {folder / 'attention.safetensors'}", file=sys.stderr)
    return 1 if counts["failed"] else 0


def cmd_report(args) -> int:
    from attnprobe.studies.ibis.report import markdown_report, write_report

    folder = _folder(args)
    m = write_report(folder, n_boot=args.bootstrap, seed=args.seed, n_perm=args.permutations,
                     plotlyjs=True if args.plotlyjs == "inline" else "cdn")
    print(markdown_report(m))
    print(f"ibis report -> {folder / 'report.html'}", file=sys.stderr)
    return 0


def cmd_all(args) -> int:
    """Behaviour and capture item group by item group (so an interrupted run has both for every
    finished item), then aggregate and report."""
    from attnprobe.studies.ibis.attention import aggregate

    items = _items(args)
    args._name = _model_name(args)
    if args.backend == "openai":
        print("ibis all: generating through the endpoint, capturing with the in-process model given by --model",
              file=sys.stderr)
    per = max(1, args.batch_size // max(1, len(args.framings)))
    if getattr(args, "ray", None) is not None:  # both stages over the whole set: shards need many items
        per = len(items)
    rc = 0
    all_ids = [it.id for it in items]
    args._pool_shared = True  # with --ray, every item group uses one pool: each replica loads the model once
    try:
        for start in range(0, len(items), per):
            args.ids = all_ids[start:start + per]
            args.limit = None
            rc = max(rc, cmd_run(args))
            rc = max(rc, cmd_capture(args, aggregate_now=False))
            print(f"ibis all: {min(start + per, len(items))}/{len(items)} items done", file=sys.stderr)
    finally:
        if getattr(args, "_pool", None) is not None:
            args._pool.close()
            args._pool = None
    args.ids, args.limit = all_ids, None
    index = aggregate(_items(args), _folder(args, args._name), protocol=args.protocol)
    _update_run(_folder(args, args._name), "aggregate", {"items": len(index["items"]) if index else 0})
    cmd_report(args)
    return rc


def cmd_check(args) -> int:
    from attnprobe.capture.models import load_model
    from attnprobe.studies.ibis.framings import check_invariants

    items = _items(args)
    loaded = load_model(args.model, dtype=args.dtype, device=args.device)
    bad = 0
    for it in items:
        res = check_invariants(loaded.tokenizer, it, protocol=args.protocol)
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
