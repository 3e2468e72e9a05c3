"""Prefix sharing: tokens prefilled and wall time with and without it, on the bundled model.

    nice -n 10 python benchmarks/prefix_sharing.py [--out benchmarks/results/prefix_sharing.json]
        [--budget SECONDS] [--steps 6,12,18] [--layers 0,14,29]

Plan sets (read-only use of the study code that builds them):

- ``counterfactual``: trajectories/long_research.jsonl, the 18 steps with >= 5 past turns; per step the
  original context and the contexts of mask:5, ircot:o, ircot:oq, ircot:oqp and refine:bm25:3
  (``counterfactual.run.build_context``), queried at the decision and reasoning-start positions.
  "Today" prefills each of them from token 0 (a counterfactual run at batch size 1). The first 6 and
  12 steps give the growth curve; ``synthetic`` is a longer trajectory (the long one's turns cycled to
  40 turns with observations cut to 240 characters, to stay in the model's 8,192 positions).
- ``runner``: the recorded runner calls (trajectories/runs/*.jsonl), queried at the decision.
- ``ibis``: the 64 IBIS items x 3 framings + the copy control (agentic with the other tool name).

Counts (plan tokens, tokens prefilled, prefix-trie size) are computed for every set. Wall time is
measured per set (wall and process CPU seconds: on a crowded machine the CPU time is the
comparable one) in three modes in the same process: ``independent`` (one prefill per plan, sharing
off), ``shared`` (prefix sharing) and ``plain-trie`` (the same passes with no scoring: the floor of a
prefill of the unique tokens). Timings run cheapest first within ``--budget``; a mode whose estimate
(from the measured tokens/s) does not fit is recorded as skipped. Results are written after every
measurement, so an interrupted run keeps what it measured.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import replace
from pathlib import Path

POLICIES = ("mask:5", "ircot:o", "ircot:oq", "ircot:oqp", "refine:bm25:3")


def counterfactual_plans(model, traj, steps, layers, policies=POLICIES):
    """{family: [plan per step]} for the originals and each policy."""
    from attnprobe.agents.policies import parse_policy
    from attnprobe.capture.api import make_plan
    from attnprobe.counterfactual.contexts import build_context

    fam: dict[str, list] = {"original": [], **{p: [] for p in policies}}
    gen: dict[str, list[int]] = {k: [] for k in fam}  # prompt tokens of each context's next action
    for s in steps:
        prefix, msg = traj.messages[: s.message_index], traj.messages[s.message_index]
        for name in fam:
            msgs = prefix if name == "original" else parse_policy(name)(prefix).messages
            c = build_context(model, traj, msgs, msg, f"{s.key}:{name}", rendering="auto", max_tokens=None)
            fam[name].append(make_plan(c.rendered, c.points, layers, desc=f"{s.key}:{name}"))
            gen[name].append(c.prefix_tokens)
    return fam, gen


def synthetic_trajectory(traj, turns: int = 40, obs_chars: int = 240):
    """The long trajectory's turns cycled to ``turns`` turns, observations cut to ``obs_chars`` characters."""
    head = [m for m in traj.messages[:2]]
    body = traj.messages[2:]
    out = list(head)
    k = 0
    while sum(1 for m in out if m["role"] == "assistant") < turns:
        m = dict(body[k % len(body)])
        if m["role"] == "tool" and isinstance(m.get("content"), str):
            m["content"] = m["content"][:obs_chars]
        out.append(m)
        k += 1
    while out[-1]["role"] != "assistant":
        out.pop()
    return replace(traj, id=f"{traj.id}-synthetic{turns}", messages=out)


def trajectory_plans(model, trajs, layers, queries="decision"):
    from attnprobe.capture.api import make_plan, prepare, select_queries

    plans = []
    for t in trajs:
        r = prepare(model, t, max_tokens=None, truncate=True)
        plans.append(make_plan(r, select_queries(r, queries), layers, desc=t.id))
    return plans


def ibis_plans(model, layers):
    from attnprobe.resources import data_path
    from attnprobe.studies.ibis.framings import COPY_CONTROL_TOOL, FRAMINGS, build_framing
    from attnprobe.studies.ibis.items import load_items

    items = load_items(data_path("ibis_items.jsonl"))
    trajs = [build_framing(it, fr) for it in items for fr in FRAMINGS]
    trajs += [replace(build_framing(it, "agentic", own_tool=COPY_CONTROL_TOOL), id=f"{it.id}-copy") for it in items]
    return trajectory_plans(model, trajs, layers)


def plain_trie(loaded, plans, chunk_size: int) -> None:
    """The sharing run's passes with no scoring: a prefill of the unique tokens (the floor)."""
    import numpy as np
    import torch

    from attnprobe_hooks.sharing import schedule
    from attnprobe_hooks.transformers.backend import chunked_prefill, crop_to, shared_cache

    ids = [np.asarray(p.input_ids) for p in plans]
    cache = shared_cache()
    for ps in schedule(ids):
        crop_to(cache, ps.start)
        chunked_prefill(loaded.model, torch.as_tensor(ids[ps.plan]), chunk_size, cache=cache, start=ps.start)


def markdown(report: dict) -> str:
    """The results tables of a report (the JSON this script writes)."""
    lines = ["| plan set | plans | tokens in the plans (today) | prefilled with sharing | prefix trie | reuse |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for name, c in report["counts"].items():
        lines.append(f"| {name} | {c['plans']} | {c['plan_tokens']:,} | {c['prefilled_tokens']:,} | "
                     f"{c['trie_tokens']:,} | {c['reuse_ratio']:.2f}x |")
    a = report.get("actions") or {}
    if a:
        lines += ["", f"Next actions (`--actions`, {a['generations']} generations at 18 steps): prompt tokens prefilled "
                      f"for generation today {a['prefill_today']:,}; from the captured cache {a['prefill_from_cache']:,} "
                      "(one per generation)."]
    lines += ["", "| plan set | mode | wall s | CPU s (process) | tokens prefilled | tokens/s (wall) | "
                  "load average (1, 5, 15 min) |", "| --- | --- | ---: | ---: | ---: | ---: | --- |"]
    for t in report["timings"]:
        if "skipped" in t:
            lines.append(f"| {t['set']} | {t['mode']} | skipped: {t['skipped']} | | | | |")
        else:
            la = ", ".join(f"{x:.1f}" for x in t["load_average"])
            cpu = f"{t['cpu_seconds']:.1f}" if "cpu_seconds" in t else "n/a"
            lines.append(f"| {t['set']} | {t['mode']} | {t['seconds']:.1f} | {cpu} | {t['tokens']:,} | "
                         f"{t['tokens_per_s']:.0f} | {la} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="benchmarks/results/prefix_sharing.json")
    ap.add_argument("--model", default="default")
    ap.add_argument("--budget", type=float, default=2400.0, help="seconds for all timings together")
    ap.add_argument("--steps", default="6,12,18", help="growth curve: first N steps of the long trajectory")
    ap.add_argument("--layers", default=None, help="comma-separated layers to score (default: all)")
    ap.add_argument("--chunk-size", type=int, default=512)
    ap.add_argument("--policies", default=",".join(POLICIES), help="policies besides the originals")
    ap.add_argument("--counterfactual-only", action="store_true", help="no synthetic, runner or IBIS sets")
    ap.add_argument("--truncate-layers", type=int, default=None,
                    help="keep only the first N decoder layers (a cheaper model with the same per-token structure, "
                         "for timing on a crowded machine; the counts do not depend on it)")
    ap.add_argument("--modes", default="shared,plain-trie,independent",
                    help="comma-separated timing modes, in this order (default: all three)")
    ap.add_argument("--markdown", default=None, help="only print the tables of an existing report (JSON) and exit")
    ap.add_argument("--timings", default=None, help="comma-separated set names to time (default: all, in this order: "
                    "counterfactual growth, synthetic, runner, ibis); 'none' for counts only")
    args = ap.parse_args()
    if args.markdown:
        print(markdown(json.loads(Path(args.markdown).read_text(encoding="utf-8"))), end="")
        return

    import torch

    import attnprobe
    from attnprobe.counterfactual.steps import choose_steps
    from attnprobe.resources import data_path
    from attnprobe_hooks.sharing import schedule, stats
    from attnprobe_hooks.transformers.backend import run_plans

    t_start = time.perf_counter()
    model = attnprobe.load_model(args.model)
    if args.truncate_layers:
        model.model.base_model.layers = model.model.base_model.layers[: args.truncate_layers]
        model.model.config.num_hidden_layers = args.truncate_layers
    layers = [int(x) for x in args.layers.split(",")] if args.layers else None
    policies = tuple(p for p in args.policies.split(",") if p)
    traj = attnprobe.load_trajectories(data_path("long_research.jsonl"))[0]
    steps = choose_steps(traj)
    sizes = sorted({min(int(x), len(steps)) for x in args.steps.split(",")})
    report: dict = {"machine": {"cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                                "load_average_start": os.getloadavg()},
                    "model": model.name, "truncate_layers": args.truncate_layers, "policies": list(policies),
                    "chunk_size": args.chunk_size, "layers": layers, "counts": {},
                    "actions": {}, "timings": []}
    out = Path(args.out)

    def save() -> None:
        report["machine"]["load_average_now"] = os.getloadavg()
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps(report, indent=1), encoding="utf-8")
        tmp.replace(out)

    def count(name: str, plans) -> dict:
        ids = [p.input_ids for p in plans]
        c = stats(ids, schedule(ids), shared=True).as_dict()
        report["counts"][name] = c
        print(f"{name}: {c}", flush=True)
        return c

    # ------------------------------------------------------------------ plan sets and counts
    fam, gen = counterfactual_plans(model, traj, steps, layers, policies)
    sets: dict[str, list] = {}
    for n in sizes:
        sets[f"counterfactual/{n}"] = [p for k in fam for p in fam[k][:n]]
    for k in fam:
        count(f"family/{k}/{len(steps)}", fam[k])
    for name, plans in sets.items():
        count(name, plans)
    order = [f"counterfactual/{n}" for n in sizes]
    if not args.counterfactual_only:
        order += more_sets(model, traj, layers, policies, sets, count, report, data_path)
    prompts = [x for k in gen for x in gen[k]]
    report["actions"] = {"generations": len(prompts), "prefill_today": int(sum(prompts)),
                         "prefill_from_cache": len(prompts)}
    save()
    run_timings(args, model, sets, report, order, save, t_start, run_plans)


def more_sets(model, traj, layers, policies, sets, count, report, data_path) -> list[str]:
    """The synthetic long trajectory, the recorded runner calls and the IBIS capture set (counts only here)."""
    import attnprobe
    from attnprobe.counterfactual.steps import choose_steps

    syn = synthetic_trajectory(traj)
    syn_steps = choose_steps(syn)
    sfam, _ = counterfactual_plans(model, syn, syn_steps, layers, policies)
    sets[f"synthetic/{len(syn_steps)}"] = [p for k in sfam for p in sfam[k]]
    count(f"synthetic/{len(syn_steps)}", sets[f"synthetic/{len(syn_steps)}"])
    report["synthetic"] = {"turns": 40, "steps": len(syn_steps), "tokens_last": int(max(p.n for p in sfam["original"]))}
    runs = []
    for f in sorted(data_path("runs").glob("*.jsonl")):
        runs += attnprobe.load_trajectories(f)
    sets["runner"] = trajectory_plans(model, runs, layers)
    count("runner", sets["runner"])
    sets["ibis"] = ibis_plans(model, layers)
    count("ibis", sets["ibis"])
    return [f"synthetic/{len(syn_steps)}", "runner", "ibis"]


def run_timings(args, model, sets, report, order, save, t_start, run_plans) -> None:
    """Wall time of each set in each mode, cheapest first, within the budget (see the module docstring)."""
    order = [] if args.timings == "none" else args.timings.split(",") if args.timings else order
    budget = args.budget
    rate = None  # tokens per second, measured
    for name in order:
        plans = sets[name]
        c = report["counts"][name]
        for mode in args.modes.split(","):
            tokens = c["plan_tokens"] if mode == "independent" else c["prefilled_tokens"]
            left = budget - (time.perf_counter() - t_start)
            if rate is not None and tokens / rate > left:
                report["timings"].append({"set": name, "mode": mode, "skipped": f"estimated {tokens / rate:.0f} s "
                                                                              f"> {left:.0f} s left"})
                save()
                continue
            t0, c0 = time.perf_counter(), time.process_time()
            if mode == "plain-trie":
                plain_trie(model, plans, args.chunk_size)
            else:
                run_plans(model, plans, chunk_size=args.chunk_size, share_prefixes=mode == "shared")
            sec, cpu = time.perf_counter() - t0, time.process_time() - c0
            rate = tokens / sec if mode != "plain-trie" else rate
            report["timings"].append({"set": name, "mode": mode, "seconds": round(sec, 2), "cpu_seconds": round(cpu, 2), "tokens": tokens,
                                      "tokens_per_s": round(tokens / sec, 1), "load_average": os.getloadavg()})
            print(report["timings"][-1], flush=True)
            save()
    report["total_seconds"] = round(time.perf_counter() - t_start, 1)
    save()


if __name__ == "__main__":
    main()
