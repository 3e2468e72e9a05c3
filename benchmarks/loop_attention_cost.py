"""What the attention side of a closed-loop study costs, captured afterwards or in the loop (issue 40).

The same study two ways, on the bundled model (CPU, float32), structured actions, batched rollouts, the
shipped loop questions x 3 settings:

  (a) ``study interference`` then ``study attention`` (every recorded call prefilled again);
  (b) ``study interference --capture-in-loop`` then ``study attention`` (the calls were captured while they
      were generated; ``study attention`` prefills only the counterfactual contexts).

Prints, per command, wall time, CPU time of the command's process (the machine may be shared: CPU seconds
are the steadier figure) and tokens prefilled (generation: the chat's per-batch log lines; capture: ``study
attention``'s per-setting lines; counterfactuals: its batch lines), then checks that every call of (b)
was captured in the loop and equals (a)'s post-hoc capture within 1e-5. Results: benchmarks/results/
loop_attention_cost.{json,md}.

    python benchmarks/loop_attention_cost.py [--scaffold seed002|ircot] [--ircot-form stream|chat] [--limit N] [--batch 24]
"""

from __future__ import annotations

import argparse
import json
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SETTINGS = {"seed002": ["none", "mask:1", "mask-obs:1"], "ircot": ["none", "ircot:o", "mask-obs:1"]}


def run(args: list[str]) -> dict:
    """One attnprobe command in its own process: wall and CPU seconds, the tokens its log says it prefilled."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "attnprobe", *args, "--no-progress"], capture_output=True, text=True,
                       cwd=ROOT)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode != 0:
        raise SystemExit(f"attnprobe {' '.join(args)} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    err = p.stderr
    num = lambda s: int(s.replace(",", ""))  # noqa: E731
    gen = [num(m) for m in re.findall(r"generation batch: \d+ requests; sent [\d,]+ tokens, prefilled ([\d,]+)", err)]
    cap = [num(m) for m in re.findall(r"(\d+) tokens prefilled for the calls captured now", err)]
    in_loop = [(int(a), int(b)) for a, b in re.findall(r"(\d+) of (\d+) calls were captured in the loop", err)]
    cf = [num(m) for m in re.findall(r"counterfactual batch: captured .*?prefilled ([\d,]+)", err)]
    return {"command": " ".join(args[:2]), "wall_s": round(wall, 1),
            "cpu_s": round(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, 1),
            "generation_prefilled": sum(gen), "capture_prefilled": sum(cap),
            "calls_captured_in_loop": sum(a for a, _ in in_loop), "calls": sum(b for _, b in in_loop),
            "counterfactual_log_lines": len(cf), "counterfactual_prefilled": sum(cf)}


def summarise(reps: list[dict]) -> dict:
    """One way's repeats: per command its median and minimum wall and CPU seconds (the token counts are the
    same in every repeat: checked), and the totals of the two commands."""
    out = {}
    for cmd in ("interference", "attention"):
        rs = [r[cmd] for r in reps]
        counts = {k: v for k, v in rs[0].items() if not k.endswith("_s")}
        if any({k: v for k, v in r.items() if not k.endswith("_s")} != counts for r in rs):
            raise SystemExit(f"{cmd}: token counts differ between repeats: {rs}")
        out[cmd] = {**counts, **{f"{t}_{stat}": round(f([r[t] for r in rs]), 1) for t in ("wall_s", "cpu_s")
                                 for stat, f in (("median", statistics.median), ("min", min))},
                    "wall_s_all": [r["wall_s"] for r in rs], "cpu_s_all": [r["cpu_s"] for r in rs]}
    for t in ("wall", "cpu"):
        for stat, f in (("median", statistics.median), ("min", min)):
            out[f"total_{t}_s_{stat}"] = round(f([r["interference"][f"{t}_s"] + r["attention"][f"{t}_s"] for r in reps]), 1)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scaffold", default="seed002", choices=sorted(SETTINGS))
    ap.add_argument("--limit", type=int, default=None, help="only the first N shipped questions (default all 8)")
    ap.add_argument("--batch", type=int, default=24, help="--episodes-per-batch (default 24: every episode at once)")
    ap.add_argument("--max-turns", type=int, default=4)
    ap.add_argument("--ircot-form", default="stream", choices=("stream", "chat"),
                    help="ircot only: Search-R1's one growing sequence (default) or the multi-turn chat")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each way, interleaved (default 3)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "loop_attention_cost"))
    a = ap.parse_args()
    from tests.support.loop_capture import compare, numbers_close

    study = ["trajectories/questions_loop.jsonl", "--scaffold", a.scaffold, "--generation-preset", "cpu",
             "--structured-actions", "--episodes-per-batch", str(a.batch), "--max-turns", str(a.max_turns),
             *[x for s in SETTINGS[a.scaffold] for x in ("--policy", s)],
             *(["--limit", str(a.limit)] if a.limit else [])]
    if a.scaffold == "ircot":
        study += ["--ircot-form", a.ircot_form]
    tmp = Path(tempfile.mkdtemp(prefix="loop_attention_cost-"))
    try:
        runs: dict[str, list[dict]] = {"a_post_hoc": [], "b_in_loop": []}
        for rep in range(a.repeat):  # interleaved (a, b, a, b, ...): a busy spell hits both ways alike
            for way, extra in (("a_post_hoc", []), ("b_in_loop", ["--capture-in-loop"])):
                out = tmp / f"{way}-{rep}"
                gen = run(["study", "interference", *study, "--out", str(out), *extra])
                att = run(["study", "attention", str(out)])
                runs[way].append({"interference": gen, "attention": att})
                print(f"{way} #{rep + 1}: interference {gen['wall_s']} s wall / {gen['cpu_s']} s CPU, attention "
                      f"{att['wall_s']} s / {att['cpu_s']} s", file=sys.stderr)
        ways = {w: summarise(r) for w, r in runs.items()}
        a0, b0 = tmp / "a_post_hoc-0", tmp / "b_in_loop-0"
        same_records = all((a0 / p.relative_to(b0)).read_bytes() == p.read_bytes() for p in b0.glob("*/calls/*.jsonl"))
        check = compare(b0, a0)
        doc_a = json.loads((a0 / "attention.json").read_text())
        doc_b = json.loads((b0 / "attention.json").read_text())
        a_, b_ = ways["a_post_hoc"], ways["b_in_loop"]
        ratio = lambda x, y: round(x / y, 3)  # noqa: E731
        result = {
            "setup": {"model": "bundled SmolLM2-135M-Instruct (float32, CPU)", "scaffold": a.scaffold,
                      "settings": SETTINGS[a.scaffold], "questions": a.limit or 8, "episodes_per_batch": a.batch,
                      "max_turns": a.max_turns, "structured_actions": True, "preset": "cpu", "repeats": a.repeat,
                      **({"ircot_form": a.ircot_form} if a.scaffold == "ircot" else {})},
            "ways": ways,
            "interference_with_capture_over_without": {
                stat: {"wall": ratio(b_["interference"][f"wall_s_{stat}"], a_["interference"][f"wall_s_{stat}"]),
                       "cpu": ratio(b_["interference"][f"cpu_s_{stat}"], a_["interference"][f"cpu_s_{stat}"])}
                for stat in ("median", "min")},
            "total_b_over_total_a": {
                stat: {"wall": ratio(b_[f"total_wall_s_{stat}"], a_[f"total_wall_s_{stat}"]),
                       "cpu": ratio(b_[f"total_cpu_s_{stat}"], a_[f"total_cpu_s_{stat}"])} for stat in ("median", "min")},
            "records_identical": same_records, "in_loop_vs_post_hoc": check,
            "attention_json_differences_over_1e-5": numbers_close(doc_a, doc_b, 1e-5)[:20],
        }
        out = Path(a.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.with_suffix(".json").write_text(json.dumps(result, indent=1))
        rows = [f"| {w} | {k} | {v['wall_s_median']} ({v['wall_s_min']}) | {v['cpu_s_median']} ({v['cpu_s_min']}) | "
                f"{v['generation_prefilled']:,} | {v['capture_prefilled']:,} | {v['counterfactual_prefilled']:,} "
                f"({v['counterfactual_log_lines']} batches) | {v['calls_captured_in_loop']} of {v['calls']} |"
                for w, d in ways.items() for k, v in (("interference", d["interference"]), ("attention", d["attention"]))]
        inter = result["interference_with_capture_over_without"]
        md = "\n".join([
            "# Loop attention cost (benchmarks/loop_attention_cost.py)", "",
            f"Setup: {json.dumps(result['setup'])}", "",
            f"Each way ran {a.repeat} times, interleaved; times are the median (minimum in brackets).", "",
            "| way | command | wall s | CPU s | generation tokens prefilled | capture tokens prefilled | "
            "counterfactual tokens prefilled | calls captured in the loop |", "|---|---|---|---|---|---|---|---|", *rows, "",
            f"Totals (median): (a) generate, then capture: {a_['total_wall_s_median']} s wall / "
            f"{a_['total_cpu_s_median']} s CPU; (b) generate with capture in the loop, then 'study attention': "
            f"{b_['total_wall_s_median']} s wall / {b_['total_cpu_s_median']} s CPU.",
            f"Interference with capture / without: median wall {inter['median']['wall']}, CPU {inter['median']['cpu']}; "
            f"minimum wall {inter['min']['wall']}, CPU {inter['min']['cpu']}.",
            f"Records identical: {same_records}. In loop vs post hoc: {json.dumps(check)}.", ""])
        out.with_suffix(".md").write_text(md)
        print(md)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
