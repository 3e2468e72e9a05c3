"""``attnprobe ibis {all,run,capture,report}`` and ``attnprobe compare``.

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

from attnprobe.io import atomic_write_text
from attnprobe.studies.ibis.framings import FRAMINGS

DEFAULT_ITEMS_NAME = "ibis_items.jsonl"
DEFAULT_RESULTS = Path("results") / "ibis"


def slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("._") or "model"


def _add_common(p: argparse.ArgumentParser, *, model: bool = True, items: bool = True):
    if items:
        p.add_argument("--items", type=Path, default=None,
                       help=f"IBIS items (JSON Lines; default: the shipped set {DEFAULT_ITEMS_NAME})")
        p.add_argument("--limit", type=int, default=None, help="use only the first N items")
        p.add_argument("--ids", nargs="+", default=None, help="use only these item ids")
        p.add_argument("--framings", nargs="+", default=list(FRAMINGS), choices=FRAMINGS)
    if model:
        p.add_argument("--model", default="default",
                       help="model for in-process generation/capture: 'default' (bundled SmolLM2), a HF folder, a "
                            "GGUF file or a cached hub id")
        p.add_argument("--dtype", default="float32")
    p.add_argument("--results", type=Path, default=DEFAULT_RESULTS,
                   help="root folder; each model gets <results>/<model-name>/ (default: results/ibis)")
    p.add_argument("--folder", type=Path, default=None, help="explicit model folder (overrides --results)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def _add_run(p):
    p.add_argument("--backend", choices=("transformers", "openai"), default="transformers",
                   help="generate in process (transformers) or through an OpenAI-compatible endpoint")
    p.add_argument("--base-url", default=None, help="endpoint for --backend openai, e.g. http://127.0.0.1:8000/v1")
    p.add_argument("--served-model", default=None, help="model name to request from the endpoint (--backend openai)")
    p.add_argument("--api-key-env", default="OPENAI_API_KEY", help="environment variable holding the API key")
    p.add_argument("--max-new-tokens", type=int, default=64, help="generation limit per decision (greedy)")
    p.add_argument("--force", action="store_true", help="redo finished items instead of resuming")
    p.add_argument("--batch-size", type=int, default=12,
                   help="prompts generated together (transformers backend; left-padded batch, same greedy output)")


def _add_capture(p):
    p.add_argument("--chunk-size", type=int, default=512, help="prefill chunk size for capture")
    p.add_argument("--force-capture", action="store_true", help="recapture finished items")


def _add_report(p):
    p.add_argument("--bootstrap", type=int, default=10000, help="bootstrap resamples for CIs")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--permutations", type=int, default=200, help="label permutations for the flip-AUC p-values")
    p.add_argument("--plotlyjs", choices=("inline", "cdn"), default="inline",
                   help="embed plotly.js in report.html (works offline) or load it from the CDN")


def register(subparsers) -> None:
    ibis = subparsers.add_parser(
        "ibis", help="inertia-bias benchmark: behaviour and attention per framing (agentic/observer/direct)",
        description="IBIS: does the model judge search results worse when the search was its own action, and "
                    "where does its attention go? 'all' runs the whole pipeline; run/capture/report do one stage. "
                    "Results go to one folder per model (layout: docs/ibis.md).")
    sub = ibis.add_subparsers(dest="ibis_action", metavar="ACTION")
    p_all = sub.add_parser("all", help="run + capture + report in one command")
    _add_common(p_all)
    _add_run(p_all)
    _add_capture(p_all)
    _add_report(p_all)
    p_all.set_defaults(func=cmd_all)
    p_run = sub.add_parser("run", help="generate and parse the next action for every item and framing")
    _add_common(p_run)
    _add_run(p_run)
    p_run.set_defaults(func=cmd_run)
    p_cap = sub.add_parser("capture", help="capture attention at the decision position for every item and framing")
    _add_common(p_cap)
    _add_capture(p_cap)
    p_cap.set_defaults(func=cmd_capture)
    p_rep = sub.add_parser("report", help="metrics.json, report.md and report.html from a model folder")
    _add_common(p_rep, model=False, items=False)
    p_rep.add_argument("--model", default="default", help="model name used to find the folder under --results")
    _add_report(p_rep)
    p_rep.set_defaults(func=cmd_report)
    p_check = sub.add_parser("check", help="validate an items file and the framing invariants for a model's template")
    _add_common(p_check)
    p_check.set_defaults(func=cmd_check)
    ibis.set_defaults(func=lambda a: (ibis.print_help(), 2)[1])

    cmp_ = subparsers.add_parser(
        "compare", help="behavioural and attentional IBIS gaps side by side across model folders",
        description="Reads metrics.json from every model folder given (or every model folder inside a results "
                    "root) and writes compare.md, compare.json and compare.html (plotly).")
    cmp_.add_argument("folders", nargs="+", type=Path, help="model folders or results roots")
    cmp_.add_argument("--out", type=Path, default=Path("results") / "ibis_compare", help="output folder")
    cmp_.add_argument("--plotlyjs", choices=("inline", "cdn"), default="inline")
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
            raise ValueError("--backend openai needs --base-url and --served-model")
        return args.served_model
    if args.model == "default":
        from attnprobe.capture.models import DEFAULT_NAME

        return DEFAULT_NAME
    return Path(args.model).stem if args.model.endswith(".gguf") else Path(args.model).name or args.model


def _folder(args, name: str | None = None) -> Path:
    return args.folder if args.folder else args.results / slug(name or _model_name(args))


def _prepare_folder(folder: Path, items, args, name: str, backend: str) -> None:
    """Write items.jsonl (the exact items used), framings.jsonl and run.json into the model folder."""
    from attnprobe._version import __version__
    from attnprobe.studies.ibis.framings import build_framing
    from attnprobe.trajectory.schema import dumps_trajectory

    folder.mkdir(parents=True, exist_ok=True)
    items_text = "".join(json.dumps(it.to_dict(), ensure_ascii=False) + "\n" for it in items)
    old = folder / "items.jsonl"
    if old.is_file() and old.read_text(encoding="utf-8") != items_text:
        from attnprobe.studies.ibis.items import load_items

        prev = {it.id: it.to_dict() for it in load_items(old)}
        changed = [it.id for it in items if it.id in prev and prev[it.id] != it.to_dict()]
        if changed:
            raise ValueError(f"{folder}: items {', '.join(changed[:5])} differ from the ones already run there; use a "
                             f"new --folder or delete the old results")
        merged = {**prev, **{it.id: it.to_dict() for it in items}}
        items_text = "".join(json.dumps(v, ensure_ascii=False) + "\n" for v in merged.values())
    atomic_write_text(old, items_text)
    from attnprobe.studies.ibis.items import IbisItem

    all_items = [IbisItem.from_dict(json.loads(line)) for line in items_text.splitlines() if line.strip()]
    atomic_write_text(folder / "framings.jsonl", "".join(
        dumps_trajectory(build_framing(it, fr)) + "\n" for it in all_items for fr in FRAMINGS))
    run_path = folder / "run.json"
    run = json.loads(run_path.read_text()) if run_path.is_file() else {}
    run.update({"model": name, "attnprobe_version": __version__, "items_source": str(args.items),
                "items_sha256": hashlib.sha256(items_text.encode()).hexdigest()[:16]})
    run.setdefault("stages", {})
    atomic_write_text(run_path, json.dumps(run, indent=1))


def _update_run(folder: Path, stage: str, info: dict) -> None:
    run_path = folder / "run.json"
    run = json.loads(run_path.read_text()) if run_path.is_file() else {"stages": {}}
    run.setdefault("stages", {})[stage] = info
    atomic_write_text(run_path, json.dumps(run, indent=1))


def _check_invariants(tokenizer, items, folder: Path | None) -> dict:
    from attnprobe.studies.ibis.framings import check_invariants

    res = check_invariants(tokenizer, items[0])
    if not res["ok"]:
        raise ValueError("framing invariants broken for this chat template: " + "; ".join(res["problems"]))
    return res


# ------------------------------------------------------------------ commands
def cmd_run(args) -> int:
    from attnprobe.capture.models import load_model
    from attnprobe.studies.ibis.behaviour import OpenAIBackend, TransformersBackend, run_behaviour

    items = _items(args)
    name = _model_name(args)
    folder = _folder(args, name)
    _prepare_folder(folder, items, args, name, args.backend)
    if args.backend == "openai":
        backend = OpenAIBackend(args.base_url, args.served_model, api_key_env=args.api_key_env)
        inv = None
    else:
        loaded = load_model(args.model, dtype=args.dtype)
        inv = _check_invariants(loaded.tokenizer, items, folder)
        backend = TransformersBackend(loaded)
    counts = run_behaviour(backend, items, folder, framings=args.framings, max_tokens=args.max_new_tokens,
                           force=args.force, progress=not args.no_progress, batch_size=args.batch_size)
    _update_run(folder, "behaviour", {"backend": args.backend, "base_url": args.base_url, "model_spec": args.model,
                                      "max_new_tokens": args.max_new_tokens, "decoding": "greedy",
                                      "batch_size": args.batch_size,
                                      "framings": args.framings, "invariants": inv, **counts})
    print(f"ibis run: {counts['decided']} decided, {counts['done_before']} already done, {counts['failed']} failed "
          f"-> {folder / 'decisions.jsonl'}", file=sys.stderr)
    return 1 if counts["failed"] else 0


def cmd_capture(args, aggregate_now: bool = True) -> int:
    from attnprobe.capture.models import load_model
    from attnprobe.studies.ibis.attention import aggregate, run_attention

    items = _items(args)
    loaded = load_model(args.model, dtype=args.dtype)
    folder = _folder(args, getattr(args, "_name", None) or loaded.name)
    if not (folder / "items.jsonl").is_file():
        _prepare_folder(folder, items, args, loaded.name, "transformers")
    inv = _check_invariants(loaded.tokenizer, items, folder)
    counts = run_attention(loaded, items, folder, framings=FRAMINGS, chunk_size=args.chunk_size,
                           force=args.force_capture, progress=not args.no_progress)
    index = aggregate(items, folder) if aggregate_now else None
    _update_run(folder, "attention", {"model_spec": args.model, "chunk_size": args.chunk_size, "invariants": inv,
                                      **counts, "aggregated_items": len(index["items"]) if index else None})
    print(f"ibis capture: {counts['captured']} captured, {counts['done_before']} already done, {counts['failed']} "
          f"failed -> {folder / 'attention.safetensors'}", file=sys.stderr)
    return 1 if counts["failed"] else 0


def cmd_report(args) -> int:
    from attnprobe.studies.ibis.report import markdown_report, write_report

    folder = args.folder if args.folder else args.results / slug(_model_name(args))
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
    rc = 0
    all_ids = [it.id for it in items]
    for start in range(0, len(items), per):
        args.ids = all_ids[start:start + per]
        args.limit = None
        rc = max(rc, cmd_run(args))
        rc = max(rc, cmd_capture(args, aggregate_now=False))
        print(f"ibis all: {min(start + per, len(items))}/{len(items)} items done", file=sys.stderr)
    args.ids, args.limit = all_ids, None
    index = aggregate(_items(args), _folder(args, args._name))
    _update_run(_folder(args, args._name), "aggregate", {"items": len(index["items"]) if index else 0})
    cmd_report(args)
    return rc


def cmd_check(args) -> int:
    from attnprobe.capture.models import load_model
    from attnprobe.studies.ibis.framings import check_invariants

    items = _items(args)
    loaded = load_model(args.model, dtype=args.dtype)
    bad = 0
    for it in items:
        res = check_invariants(loaded.tokenizer, it)
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
