"""The measured table of docs/counterfactual.md: the shipped long trajectory under observation masking
(by observations and by turns), the IRCoT variants and the extractive BM25 refiner (every round, and
latest round only), with greedy next actions and the recorded step's log-probability, on the bundled model.

    python benchmarks/counterfactual_long.py --out runs/cf-long [--turns 5,8,11,14,17,20] [--policies ...]

Resumable (rerun to continue). After the capture, every step folder gets the issue-19 fields
(:func:`attnprobe.counterfactual.extras.augment_step_folder`: refined split, own-tool action,
log-probability). Prints the summary tables and writes OUT/summary.json / summary.md.

    python benchmarks/counterfactual_long.py --from-baseline [--policies refine:bm25:3,refine-latest:bm25:3]

Model-free (the tokenizer only): the numbers that need only the ORIGINAL row, at the reasoning start of
every step with >= 5 past turns, from the stored whole-trajectory capture of the behaviour baseline
(``tests/data/baseline/capture/sample-long-research.*``; causal attention makes its rows the run's
original rows): removed mass, the refined split (dropped / kept again / other) and tokens saved. No
redistribution, action or log-probability (those need the counterfactual capture).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

POLICIES = ("mask:5", "mask-obs:5", "ircot:o", "ircot:oq", "ircot:oqp", "refine:bm25:3", "refine-latest:bm25:3")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/cf-long")
    ap.add_argument("--model", default="default")
    ap.add_argument("--turns", default=None, help="comma-separated step turns (default: every step with >= 5 past turns)")
    ap.add_argument("--min-past", type=int, default=5, help="5 keeps the old table's step set for every policy")
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--batch-size", type=int, default=1,
                    help="trajectories per backend call (the steps of a trajectory always share one pass)")
    ap.add_argument("--no-actions", action="store_true")
    ap.add_argument("--no-logprob", action="store_true")
    ap.add_argument("--from-baseline", action="store_true", help="model-free reasoning-start numbers (see above)")
    args = ap.parse_args()
    if args.from_baseline:
        from_baseline([p for p in args.policies.split(",") if p])
        return

    import attnprobe
    from attnprobe.agents.policies import parse_policy, policy_name
    from attnprobe.counterfactual.extras import augment_step_folder, steps_of
    from attnprobe.counterfactual.job import run_counterfactuals
    from attnprobe.counterfactual.run import RunOptions
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
                                 min_past=args.min_past, batch_size=args.batch_size,
                                 opts=RunOptions(actions=not args.no_actions, max_new_tokens=args.max_new_tokens,
                                                 logprob=not args.no_logprob, progress=True))
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


def from_baseline(specs: list[str]) -> None:
    from dataclasses import replace

    import numpy as np
    from safetensors.numpy import load_file
    from transformers import AutoTokenizer

    import attnprobe
    from attnprobe.agents.policies import parse_policy
    from attnprobe.counterfactual.analysis import REMOVING, token_messages
    from attnprobe.counterfactual.refined import refined_mass_split
    from attnprobe.counterfactual.steps import choose_steps
    from attnprobe.model_files import default_gguf_path
    from attnprobe.render.rendering import render
    from attnprobe.render.segments import QueryPoint, Segment
    from attnprobe.resources import data_path
    from attnprobe.results.result import CaptureResult
    from attnprobe.stats import bootstrap_mean_ci

    base = Path(__file__).resolve().parents[1] / "tests" / "data" / "baseline" / "capture" / "sample-long-research"
    gguf = default_gguf_path()
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    traj = attnprobe.load_trajectories(data_path("long_research.jsonl"))[0]
    rendered = render(traj, tok)
    arrays, meta = load_file(f"{base}.safetensors"), json.loads(Path(f"{base}.json").read_text())
    if not np.array_equal(rendered.input_ids, arrays["input_ids"]):
        raise SystemExit("the baseline capture does not match today's rendering of the trajectory")
    res = CaptureResult(traj.id, arrays["input_ids"], [Segment(**x) for x in meta["segments"]],
                        [QueryPoint(**q) for q in meta["queries"]], meta["layers"], arrays["segment_attention"],
                        arrays["layer_head_attention"], arrays["token_attention"], text=rendered.text,
                        offsets=rendered.offsets)
    owner = token_messages(res)
    qi = {q.message_index: k for k, q in enumerate(res.queries) if q.kind == "reasoning"}

    def ctx_tokens(messages):
        return len(render(replace(traj, messages=list(messages)), tok).input_ids)

    def ci(v):
        v = np.asarray(v, dtype=np.float64)
        lo, hi = bootstrap_mean_ci(v, n_boot=2000)
        return f"{100 * v.mean():.1f} [{100 * lo:.1f}, {100 * hi:.1f}]"

    lines = ["| policy | steps (changed) | mass on changed messages % | of it: dropped % | kept again % | other % | "
             "split messages | tokens saved |", "|---|---|---|---|---|---|---|---|"]
    for spec in specs:
        policy = parse_policy(spec)
        rows = []
        for st in choose_steps(traj, min_past=5):
            cfx = policy(traj.messages[: st.message_index])
            row = np.asarray(res.token_attention[qi[st.message_index]], dtype=np.float64)
            gone = [i for i, v in cfx.changes.items() if v in REMOVING]
            split = refined_mass_split(res, cfx.details.get("refined") or {}, qi[st.message_index])
            n_orig, n_cf = ctx_tokens(traj.messages[: st.message_index]), ctx_tokens(cfx.messages)
            rows.append((float(row[np.isin(owner, gone)].sum()), split["dropped"], split["kept_again"], split["other"],
                         split["split_messages"], len(split["unsplit"]), n_orig - n_cf, (n_orig - n_cf) / n_orig,
                         cfx.changed))
        r = list(zip(*rows))
        lines.append(f"| {spec} | {len(rows)} ({sum(r[8])}) | {ci(r[0])} | {ci(r[1])} | {ci(r[2])} | {ci(r[3])} | "
                     f"{sum(r[4])} ({sum(r[5])} unsplit) | {np.mean(r[6]):.0f} ({100 * np.mean(r[7]):.0f}%) |")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
