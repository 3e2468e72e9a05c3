"""Core subcommands: capture, report, demo, serve."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from attnprobe.errors import AttnprobeError


def parse_int_list(text: str | None) -> list[int] | None:
    """'0,3,5-8' -> [0, 3, 5, 6, 7, 8]; None/'all' -> None."""
    if text is None or text == "all":
        return None
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            if "-" in part:
                a, b = part.split("-", 1)
                out.extend(range(int(a), int(b) + 1))
            else:
                out.append(int(part))
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a list of integers or ranges: {text!r}") from None
    return out


def _queries(text: str):
    if text.startswith("positions:"):
        return parse_int_list(text.split(":", 1)[1])
    return text


def add_capture_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="default",
                   help="'default' (bundled SmolLM2-135M-Instruct), a local HF folder, a .gguf file, or a cached hub id")
    p.add_argument("--backend", default="transformers", choices=["transformers", "vllm"])
    p.add_argument("--dtype", default="float32", help="float32 (exact reference), bfloat16 or float16")
    p.add_argument("--device", default="cpu", help="transformers device, e.g. cpu or cuda")
    p.add_argument("--tensor-parallel-size", type=int, default=1, help="vLLM only: tensor-parallel ranks")
    p.add_argument("--queries", default="reasoning", type=_queries,
                   help="reasoning | decision | reasoning+decision | positions:10,20,300")
    p.add_argument("--layers", default=None, type=parse_int_list, help="layers to score, e.g. '0-3,10' (default all)")
    p.add_argument("--chunk-size", type=int, default=512, help="prefill chunk size in tokens (default 512)")
    p.add_argument("--rendering", default="auto", choices=["auto", "native", "native+reasoning-in-content", "text"])
    p.add_argument("--max-tokens", type=int, default=None,
                   help="refuse longer trajectories (default: the model's max_position_embeddings)")
    p.add_argument("--truncate", action="store_true", help="truncate over-long trajectories instead of refusing")
    p.add_argument("--save-qk-layers", type=parse_int_list, default=[], help="also save q/k of these layers")


def load_for_capture(args):
    from attnprobe.capture.models import load_model

    if args.backend == "vllm":
        return load_model(args.model, backend="vllm", dtype=args.dtype,
                          tensor_parallel_size=args.tensor_parallel_size, chunk_size=args.chunk_size)
    return load_model(args.model, dtype=args.dtype, device=args.device)


def _settings(args) -> dict:
    return {"model": args.model, "backend": args.backend, "dtype": args.dtype, "queries": args.queries,
            "layers": args.layers, "chunk_size": args.chunk_size, "rendering": args.rendering,
            "save_qk_layers": args.save_qk_layers or []}


def run_capture_files(args, files: list[Path], out: Path) -> int:
    """Capture every trajectory of every file into out/<safe id>/; skip finished ones (resume)."""
    from tqdm.auto import tqdm

    from attnprobe.capture.api import capture
    from attnprobe.io import append_line_atomic, safe_name
    from attnprobe.results.result import META_FILE
    from attnprobe.trajectory.schema import load_trajectories

    trajs = []
    for f in files:
        trajs.extend(load_trajectories(f))  # validate everything before the slow part
    if not trajs:
        raise AttnprobeError("no trajectories in the given files")
    settings = _settings(args)
    todo = []
    for t in trajs:
        meta = out / safe_name(t.id) / META_FILE
        if meta.is_file() and not args.force:
            done = json.loads(meta.read_text(encoding="utf-8")).get("cli_settings")
            if done == json.loads(json.dumps(settings)):
                continue
        todo.append(t)
    skipped = len(trajs) - len(todo)
    if skipped:
        print(f"resuming: {skipped} of {len(trajs)} trajectories already captured in {out}", file=sys.stderr)
    if not todo:
        return 0
    model = load_for_capture(args)
    failures = 0
    for t in tqdm(todo, desc="capture", unit="traj"):
        try:
            res = capture(model, t, queries=args.queries, layers=args.layers, chunk_size=args.chunk_size,
                          rendering=args.rendering, max_tokens=args.max_tokens, truncate=args.truncate,
                          save_qk_layers=args.save_qk_layers or (), progress=True)
        except AttnprobeError as exc:
            failures += 1
            print(f"attnprobe: {t.id}: {exc}", file=sys.stderr)
            append_line_atomic(out / "errors.jsonl", json.dumps({"trajectory_id": t.id, "error": str(exc)}))
            continue
        res.meta["cli_settings"] = settings
        res.save(out / safe_name(t.id))
    print(f"captured {len(todo) - failures} trajectories into {out}" + (f"; {failures} failed" if failures else ""),
          file=sys.stderr)
    return 1 if failures else 0


def cmd_capture(args) -> int:
    return run_capture_files(args, [Path(p) for p in args.trajectories], Path(args.out))


def cmd_report(args) -> int:
    from attnprobe.results.report import write_report

    path = write_report(Path(args.results), Path(args.out) if args.out else None)
    print(f"report written to {path}")
    return 0


def cmd_demo(args) -> int:
    from attnprobe.resources import SAMPLE_TRAJECTORIES, data_path

    files = [data_path(f) for f in SAMPLE_TRAJECTORIES]
    out = Path(args.out)
    code = run_capture_files(args, files, out)
    from attnprobe.results.report import write_report

    path = write_report(out)
    print(f"demo done: captures in {out}, report at {path}")
    return code


def cmd_serve(args) -> int:
    from attnprobe.capture.models import load_model
    from attnprobe.generation.server import make_server

    server = make_server(load_model(args.model, dtype=args.dtype), args.host, args.port)
    host, port = server.server_address[:2]
    print(f"serving {args.model} on http://{host}:{port}/v1", flush=True)
    try:
        server.serve_forever()
    finally:
        server.server_close()
    return 0


def cmd_import(args) -> int:
    from attnprobe.trajectory.importers import iter_import
    from attnprobe.trajectory.schema import save_trajectories

    trajs = [t for path in args.inputs for t in iter_import(path, args.format)]
    save_trajectories(trajs, Path(args.out))
    print(f"wrote {len(trajs)} trajectories to {args.out}")
    return 0


def register(sub) -> None:
    p = sub.add_parser("capture", help="capture attention for trajectories (chunked prefill + online scoring)",
                       description="Render each trajectory with the model's chat template, run one chunked prefill "
                                   "with capture hooks, and save exact attention by segment, turn and role. "
                                   "Finished trajectories are skipped on rerun (use --force to redo).")
    p.add_argument("trajectories", nargs="+", help="JSONL trajectory files")
    p.add_argument("--out", required=True, help="output folder (one subfolder per trajectory)")
    p.add_argument("--force", action="store_true", help="recapture even if a result exists")
    add_capture_options(p)
    p.set_defaults(func=cmd_capture)

    p = sub.add_parser("report", help="write an HTML report (plotly) over capture folders",
                       description="Heatmaps and per-step breakdowns per trajectory, decay curves and headline "
                                   "shares overall, for every capture folder below RESULTS.")
    p.add_argument("results", help="folder with capture results")
    p.add_argument("--out", help="report path (default RESULTS/report.html)")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("demo", help="capture + report on the shipped sample trajectories with the bundled model",
                       description="The main job on the embedded default: captures the sample trajectories in "
                                   "trajectories/ with SmolLM2-135M-Instruct and writes an HTML report.")
    p.add_argument("--out", default="runs/demo", help="output folder (default runs/demo)")
    p.add_argument("--force", action="store_true", help="recapture even if results exist")
    add_capture_options(p)
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("import", help="convert other agents' logs into attnprobe trajectories",
                       description="Formats: openai (message lists, one per line or {messages, tools, id}), "
                                   "masking (qid/question/full_messages records), smolagents (memory messages).")
    p.add_argument("inputs", nargs="+", help=".json or .jsonl files")
    p.add_argument("--format", required=True, choices=["openai", "masking", "smolagents"])
    p.add_argument("--out", required=True, help="output .jsonl")
    p.set_defaults(func=cmd_import)

    p = sub.add_parser("serve", help="serve a transformers model on an OpenAI-compatible HTTP endpoint",
                       description="A small /v1/chat/completions server (loopback by default) for runs against "
                                   "the bundled model through the OpenAI-compatible code path.")
    p.add_argument("--model", default="default")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.set_defaults(func=cmd_serve)
