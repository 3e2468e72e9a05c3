"""``attnprobe run``: the NIS-Agent runner over a JSONL of questions."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from attnprobe.errors import AttnprobeError
from attnprobe.studies.runner.config import FILTER_MODES, PRESETS, VALIDATION_MODES, RunSettings

EPILOG = """\
Examples:
  attnprobe run trajectories/questions.jsonl --preset baseline --out runs/baseline.jsonl
  attnprobe run trajectories/questions.jsonl --preset nis-agent --out runs/nis.jsonl --resume
  attnprobe run q.jsonl --filter in-context --validation stage1 --out runs/ablation.jsonl
  OPENAI_API_KEY=... attnprobe run q.jsonl --base-url http://127.0.0.1:8000/v1 --model my-model --out runs/x.jsonl
  ATTNPROBE_SEARCH_KEY=... attnprobe run q.jsonl --search http --out runs/web.jsonl

Outputs: OUT (every model call as a trajectory; capture works on it), OUT with .results.ndjson (one
line per finished question) and .summary.json (accuracy and average tokens per question).
Questions: JSON Lines with "id", "question" and optionally "answer" and "aliases".
"""


def register(sub) -> None:
    p = sub.add_parser("run", help="run the NIS-Agent manager/worker agents over questions, recording every call",
                       description="Run the NIS-Agent runner (manager + search worker, context-isolated filter, "
                                   "isolation-based stepwise validation) over a JSONL of questions. Every model "
                                   "call is appended atomically as a trajectory; --resume continues after a crash.",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("questions", help="JSONL of questions ({id, question, answer, aliases})")
    p.add_argument("--out", required=True, help="output JSONL of recorded calls (trajectories)")
    p.add_argument("--preset", choices=sorted(PRESETS), default="nis-agent",
                   help="baseline = no filter, no validation; nis-agent = isolated filter + stages 1+2 (default)")
    p.add_argument("--filter", choices=FILTER_MODES, help="override the preset's filter")
    p.add_argument("--validation", choices=VALIDATION_MODES, help="override the preset's validation (full = 1+2)")
    p.add_argument("--name", help="setting name used in run ids (default: the preset, or 'custom' with overrides)")
    p.add_argument("--model", default="default",
                   help="model spec for the in-process backend (default: bundled SmolLM2), or the model name "
                        "for --base-url")
    p.add_argument("--base-url", help="use an OpenAI-compatible endpoint (e.g. http://127.0.0.1:8000/v1)")
    p.add_argument("--api-key-env", default="OPENAI_API_KEY", help="environment variable holding the API key")
    p.add_argument("--search", choices=("bm25", "http"), default="bm25",
                   help="bm25 = offline corpus (default); http = web search API (ATTNPROBE_SEARCH_* variables)")
    p.add_argument("--corpus", help="JSONL corpus for bm25 (default: trajectories/corpus/docs.jsonl)")
    p.add_argument("--manager-steps", type=int, default=3)
    p.add_argument("--worker-steps", type=int, default=3)
    p.add_argument("--max-rewrites", type=int, default=1)
    p.add_argument("--max-tokens", type=int, default=128, help="max new tokens per model call")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--limit", type=int, help="only the first N questions")
    p.add_argument("--resume", action="store_true", help="continue OUT: skip finished questions, replay partial runs")
    p.add_argument("--overwrite", action="store_true", help="delete OUT and its results first")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=cmd_run)


def make_chat(args):
    if args.base_url:
        from attnprobe.generation.chat import OpenAIChat

        return OpenAIChat(args.base_url, args.model if args.model != "default" else "default",
                          api_key_env=args.api_key_env)
    from attnprobe.capture.models import load_model
    from attnprobe.studies.runner.backends import StopAtCallChat

    return StopAtCallChat(load_model(args.model))


def cmd_run(args) -> int:
    from attnprobe.studies.runner.run import load_questions, run_questions, token_table
    from attnprobe.studies.runner.search import make_search

    overrides = {k: v for k, v in (("filter", args.filter), ("validation", args.validation)) if v}
    settings = RunSettings.preset(
        args.preset, **overrides, manager_steps=args.manager_steps, worker_steps=args.worker_steps,
        max_rewrites=args.max_rewrites, max_tokens=args.max_tokens, temperature=args.temperature,
        name=args.name or (args.preset if not overrides else "custom"))
    if args.resume and args.overwrite:
        raise AttnprobeError("--resume and --overwrite exclude each other")
    questions = load_questions(args.questions)
    if args.limit:
        questions = questions[: args.limit]
    search = make_search(args.search, args.corpus)  # fails early on missing keys / corpus
    chat = make_chat(args)
    out = run_questions(chat, questions, settings, Path(args.out), search=search, resume=args.resume,
                        overwrite=args.overwrite, progress=not args.no_progress)
    s = out["summary"]
    print(token_table({settings.name: s}))
    if out["skipped"]:
        print(f"({out['skipped']} finished question(s) were skipped: --resume)")
    print(json.dumps({"out": args.out, "accuracy": s["accuracy"], "runs": s["runs"]}), file=sys.stderr)
    return 0
