"""The measured table of docs/counterfactual.md: the shipped long trajectory under observation masking
(by observations and by turns), the IRCoT variants and the extractive BM25 refiner (every round, and
latest round only), with greedy next actions and the recorded step's log-probability, on the bundled model.

    python benchmarks/counterfactual_long.py --out runs/cf-long [--turns 5,8,11,14,17,20] [--policies ...]

Resumable (rerun to continue). After the capture, every step folder gets the issue-19 fields
(:func:`attnprobe.counterfactual.extras.augment_step_folder`: refined split, own-tool action,
log-probability). Prints the summary tables and writes OUT/summary.json / summary.md.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

POLICIES = ("mask:5", "mask-turns:5", "ircot:o", "ircot:oq", "ircot:oqp", "refine:bm25:3", "refine-latest:bm25:3")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/cf-long")
    ap.add_argument("--model", default="default")
    ap.add_argument("--turns", default=None, help="comma-separated step turns (default: every step with >= 5 past turns)")
    ap.add_argument("--min-past", type=int, default=5, help="5 keeps the old table's step set for every policy")
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--no-actions", action="store_true")
    ap.add_argument("--no-logprob", action="store_true")
    args = ap.parse_args()

    import attnprobe
    from attnprobe.counterfactual.extras import augment_step_folder, steps_of
    from attnprobe.counterfactual.policies import parse_policy, policy_name
    from attnprobe.counterfactual.run import RunOptions, run_counterfactuals
    from attnprobe.counterfactual.summary import markdown_table, summarize_dir
    from attnprobe.generation.transformers_chat import TransformersChat
    from attnprobe.io import atomic_write_text, finite_json, load_json
    from attnprobe.resources import data_path

    model = attnprobe.load_model(args.model)
    trajs = attnprobe.load_trajectories(data_path("long_research.jsonl"))
    policies = [parse_policy(p) for p in args.policies.split(",")]
    turns = [int(x) for x in args.turns.split(",")] if args.turns else None
    t0 = time.perf_counter()
    counts = run_counterfactuals(model, trajs, policies, args.out, turns=turns, chat=TransformersChat(model),
                                 min_past=args.min_past,
                                 opts=RunOptions(actions=not args.no_actions, max_new_tokens=args.max_new_tokens,
                                                 progress=True))
    t1 = time.perf_counter()
    out = Path(args.out)
    original_lp: dict[tuple[str, int], dict] = {}
    for traj in trajs:
        for p in policies:
            for path in steps_of(out, traj.id, policy_name(p)):
                rec = load_json(path)
                needs = (not args.no_logprob and "logprob" not in rec) or (
                    isinstance(rec.get("action"), dict) and "own" not in rec["action"])
                if not needs:
                    continue
                key = (traj.id, int(rec["step_message_index"]))
                rec = augment_step_folder(path.parent, traj, p, model=None if args.no_logprob else model,
                                          original_logprob=original_lp.get(key))
                if "logprob" in rec:
                    original_lp[key] = rec["logprob"]["original"]
    print(f"{counts}: capture {t1 - t0:.0f} s, extra fields {time.perf_counter() - t1:.0f} s")
    skipped: list = []
    summary = summarize_dir(out, skipped=skipped)
    atomic_write_text(out / "summary.json", json.dumps(finite_json({"policies": summary, "skipped": skipped}),
                                                       indent=1, allow_nan=False))
    md = "\n".join(f"## query: {q}\n\n{markdown_table(summary, q)}" for q in ("decision", "reasoning"))
    atomic_write_text(out / "summary.md", md)
    print(md)


if __name__ == "__main__":
    main()
