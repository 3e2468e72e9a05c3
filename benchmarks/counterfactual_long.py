"""The measured table of docs/counterfactual.md: the shipped long trajectory under mask:5, ircot:o,
ircot:oq, ircot:oqp and the extractive BM25 refiner, with greedy next actions, on the bundled model.

    python benchmarks/counterfactual_long.py --out runs/cf-long [--turns 5,8,11,14,17,20]

Resumable (rerun to continue). Prints the summary tables and writes OUT/summary.json / summary.md.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/cf-long")
    ap.add_argument("--model", default="default")
    ap.add_argument("--turns", default=None, help="comma-separated step turns (default: every step with >= 5 past turns)")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--no-actions", action="store_true")
    args = ap.parse_args()

    import attnprobe
    from attnprobe.counterfactual.job import run_counterfactuals
    from attnprobe.counterfactual.policies import parse_policy
    from attnprobe.counterfactual.run import RunOptions
    from attnprobe.counterfactual.summary import markdown_table, summarize_dir
    from attnprobe.generation.transformers_chat import TransformersChat
    from attnprobe.io import atomic_write_text, finite_json
    from attnprobe.resources import data_path

    model = attnprobe.load_model(args.model)
    trajs = attnprobe.load_trajectories(data_path("long_research.jsonl"))
    policies = [parse_policy(p) for p in ("mask:5", "ircot:o", "ircot:oq", "ircot:oqp", "refine:bm25:3")]
    turns = [int(x) for x in args.turns.split(",")] if args.turns else None
    t0 = time.perf_counter()
    counts = run_counterfactuals(model, trajs, policies, args.out, turns=turns, chat=TransformersChat(model),
                                 opts=RunOptions(actions=not args.no_actions, max_new_tokens=args.max_new_tokens,
                                                 progress=True))
    print(f"{counts} in {time.perf_counter() - t0:.0f} s")
    out = Path(args.out)
    summary = summarize_dir(out)
    atomic_write_text(out / "summary.json", json.dumps(finite_json(summary), indent=1, allow_nan=False))
    md = "\n".join(f"## query: {q}\n\n{markdown_table(summary, q)}" for q in ("decision", "reasoning"))
    atomic_write_text(out / "summary.md", md)
    print(md)


if __name__ == "__main__":
    main()
