"""Closed-loop throughput (issue 30): how fast `study interference` steps its episodes.

    python benchmarks/loop_throughput.py [--out benchmarks/results/loop_throughput.json]
        [--questions 16] [--settings none,mask:1,ircot:oq] [--max-new-tokens 48] [--latency 0.2]
        [--skip-model] [--skip-endpoint]

Two parts, measured in one process, each writing its study folders under a temporary directory:

- ``model``: the bundled SmolLM2-135M in process, IRCoT scaffold with ``--structured-actions`` (so the
  135M model searches), ``--questions`` questions (the shipped loop set, then the runner's set, questions
  with the same text once) x ``--settings``. Modes: ``sequential`` (one episode at a time, every turn
  prefilled from token 0), ``batched`` (all episodes stepped together, one padded batch per turn) and
  ``batched+reuse`` (and each episode's KV cache kept between turns: a turn prefills only what changed).
  Per mode: wall seconds, model calls/s, tokens generated/s, tokens sent vs prefilled, and whether its
  records equal the sequential mode's (replies compared call by call).
- ``endpoint``: a scripted OpenAI-compatible endpoint in this process that answers every request after a
  fixed ``--latency`` (deterministic IRCoT replies from what it is sent), ``--concurrency 1`` vs 8, same study
  shape. Records must be identical apart from timings.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the one scripted endpoint (tests/support/scripted_server.py)

TIMING = ("seconds",)  # time-based fields: a result's seconds, study.json's mean seconds (AIT) and its CI


def untimed(x):
    """``x`` without its time-based fields (any key starting with one of :data:`TIMING`), at any depth."""
    if isinstance(x, dict):
        return {k: untimed(v) for k, v in x.items() if not k.startswith(TIMING)}
    if isinstance(x, list):
        return [untimed(v) for v in x]
    return x


def questions(n: int) -> list[dict]:
    """The shipped loop set, then the runner's set (a question whose text is already in is skipped)."""
    from attnprobe.agents.questions import read_questions

    out, seen = [], set()
    for f in ("questions_loop.jsonl", "questions.jsonl"):
        for q in read_questions(ROOT / "trajectories" / f):
            if q["question"] not in seen:
                seen.add(q["question"])
                out.append(q)
    if len(out) < n:
        raise SystemExit(f"only {len(out)} distinct questions shipped; asked for {n}")
    return out[:n]


def records(out: Path) -> dict[str, str]:
    """Every file a study wrote, with the time fields of results dropped: equal dicts = equal records."""
    got = {}
    for p in sorted(out.rglob("*")):
        if not p.is_file() or p.name.startswith(".") or p.name in ("study.md", "errors.jsonl"):
            continue
        text = p.read_text()
        if p.suffix == ".json":
            text = json.dumps(untimed(json.loads(text)), sort_keys=True)
        got[str(p.relative_to(out))] = text
    return got


def totals(out: Path, settings) -> dict:
    rs = [json.loads(p.read_text()) for s in settings for p in (out / s.replace(":", "-") / "results").glob("*.json")]
    return {"episodes": len(rs), "model_calls": sum(r["model_calls"] for r in rs),
            "retrievals": sum(r["retrievals"] for r in rs), "output_tokens": sum(r["output_tokens"] for r in rs),
            "input_tokens": sum(r["input_tokens"] for r in rs)}


def study(chat, out: Path, qs, settings, config, batch_size: int) -> dict:
    from attnprobe.execution.local import LocalExecutor
    from attnprobe.studies.loop.study import run_study

    t0 = time.perf_counter()
    with LocalExecutor(lambda: chat, progress=False) as ex:
        counts, _ = run_study(ex, out, qs, settings, config, batch_size=batch_size, n_boot=200,
                              model=getattr(chat, "name", None))
    wall = time.perf_counter() - t0
    if counts["failed"]:
        raise SystemExit(f"{out}: {counts['failed']} episodes failed (see {out}/errors.jsonl)")
    t = totals(out, settings)
    return {**t, "wall_s": round(wall, 2), "calls_per_s": round(t["model_calls"] / wall, 3),
            "generated_tok_per_s": round(t["output_tokens"] / wall, 2)}


# ---------------------------------------------------------------------------------------------- endpoint
def ircot_script(body: dict) -> str:
    """IRCoT replies from what is sent: search twice (the query names the question and the turn), then answer."""
    text = "\n".join(str(m.get("content") or "") for m in body.get("messages") or [])
    seen = sum(m.get("role") == "assistant" for m in body.get("messages") or [])
    q = re.search(r"Question: (.*?)\n", text)
    topic = " ".join((q.group(1) if q else "the question").split()[:6])
    if seen < 2:
        return f"<think>I need more facts ({seen}).</think>\n<search>{topic} {seen + 1}</search>"
    return "<think>Enough read.</think>\n<answer>1981</answer>"


def endpoint_part(args, tmp: Path) -> dict:
    from support.scripted_server import scripted_endpoint

    from attnprobe.generation.factory import open_backend
    from attnprobe.studies.loop.agents import LoopConfig

    qs, settings = questions(args.questions), args.settings
    config = LoopConfig(scaffold="ircot", ircot_form="chat", max_new_tokens=args.max_new_tokens)
    rows, recs = {}, {}
    with scripted_endpoint(latency=args.latency, reply=ircot_script) as ep:
        for n in (1, 8):
            chat = open_backend("openai", model="scripted", base_url=ep.url, concurrency=n)
            out = tmp / f"endpoint-c{n}"
            rows[f"concurrency {n}"] = {**study(chat, out, qs, settings, config, batch_size=n), "concurrency": n}
            recs[n] = records(out)
            print(f"endpoint concurrency {n}: {rows[f'concurrency {n}']}", flush=True)
    speedup = rows["concurrency 1"]["wall_s"] / rows["concurrency 8"]["wall_s"]
    return {"latency_s": args.latency, "questions": len(qs), "settings": settings, "modes": rows,
            "speedup_8_vs_1": round(speedup, 2), "records_identical": recs[1] == recs[8]}


# ---------------------------------------------------------------------------------------------- in process
def replies(out: Path) -> dict[str, str]:
    """Every recorded reply, keyed by call id (the comparison of modes: greedy replies should be equal)."""
    got = {}
    for p in sorted(out.glob("*/calls/*.jsonl")):
        for line in p.read_text().splitlines():
            c = json.loads(line)
            got[c["id"]] = c["messages"][-1].get("content") or ""
    return got


def model_part(args, tmp: Path) -> dict:
    from attnprobe.capture.models import load_model
    from attnprobe.generation.transformers_chat import TransformersChat
    from attnprobe.studies.loop.agents import LoopConfig

    qs, settings = questions(args.questions), args.settings
    config = LoopConfig(scaffold="ircot", ircot_form="chat", max_new_tokens=args.max_new_tokens, structured_actions=True)
    loaded = load_model(args.model)
    modes = {"sequential": (1, 0), "batched": (args.batch_size, 0), "batched+reuse": (args.batch_size, 64)}
    rows, got = {}, {}
    for name, (batch, kept) in modes.items():
        chat = TransformersChat(loaded, max_kept_episodes=kept)
        out = tmp / f"model-{name.replace('+', '-')}"
        row = study(chat, out, qs, settings, config, batch_size=batch)
        s = chat.stats
        row.update(batch_size=batch, prefix_reuse=bool(kept), tokens_sent=s["sent"], tokens_prefilled=s["prefilled"],
                   tokens_generated=s["generated"], generate_calls=s["calls"])
        got[name] = replies(out)
        base = got["sequential"]
        row["replies_equal_to_sequential"] = f"{sum(got[name].get(k) == v for k, v in base.items())}/{len(base)}"
        rows[name] = row
        print(f"model {name}: {row}", flush=True)
    seq = rows["sequential"]["wall_s"]
    return {"model": loaded.name, "questions": len(qs), "settings": settings, "scaffold": "ircot",
            "structured_actions": True, "max_new_tokens": args.max_new_tokens, "modes": rows,
            "speedup_batched": round(seq / rows["batched"]["wall_s"], 2),
            "speedup_batched_reuse": round(seq / rows["batched+reuse"]["wall_s"], 2)}


def markdown(doc: dict) -> str:
    lines = ["# Closed-loop throughput (benchmarks/loop_throughput.py)", "",
             f"Machine: {doc['machine']}; measured {doc['date']} in one run.", ""]
    if "model" in doc:
        m = doc["model"]
        lines += [f"## In process: {m['model']}, IRCoT with structured actions, {m['questions']} questions x "
                  f"{len(m['settings'])} settings ({', '.join(m['settings'])}), max {m['max_new_tokens']} new tokens",
                  "", "| mode | batch | wall s | model calls | calls/s | generated tok/s | tokens sent | prefilled | "
                  "retrievals | replies = sequential |", "|---|---|---|---|---|---|---|---|---|---|"]
        for name, r in m["modes"].items():
            lines.append(f"| {name} | {r['batch_size']} | {r['wall_s']} | {r['model_calls']} | {r['calls_per_s']} | "
                         f"{r['generated_tok_per_s']} | {r['tokens_sent']} | {r['tokens_prefilled']} | "
                         f"{r['retrievals']} | {r['replies_equal_to_sequential']} |")
        lines += ["", f"Speed-up over sequential: batched {m['speedup_batched']}x, batched with prefix reuse "
                      f"{m['speedup_batched_reuse']}x.", ""]
    if "endpoint" in doc:
        e = doc["endpoint"]
        lines += [f"## Scripted OpenAI-compatible endpoint, {e['latency_s'] * 1000:.0f} ms per request, "
                  f"{e['questions']} questions x {len(e['settings'])} settings", "",
                  "| concurrency | wall s | model calls | calls/s |", "|---|---|---|---|"]
        for r in e["modes"].values():
            lines.append(f"| {r['concurrency']} | {r['wall_s']} | {r['model_calls']} | {r['calls_per_s']} |")
        lines += ["", f"Speed-up at concurrency 8: {e['speedup_8_vs_1']}x; records identical apart from timings: "
                      f"{e['records_identical']}.", ""]
    return "\n".join(lines)


def main() -> None:
    import datetime
    import os
    import platform

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "loop_throughput.json"))
    p.add_argument("--model", default="default")
    p.add_argument("--questions", type=int, default=16)
    p.add_argument("--settings", type=lambda t: t.split(","), default=["none", "mask:1", "ircot:oq"])
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--latency", type=float, default=0.2)
    p.add_argument("--skip-model", action="store_true")
    p.add_argument("--skip-endpoint", action="store_true")
    args = p.parse_args()
    doc = {"machine": f"{platform.machine()}, {os.cpu_count()} CPUs, torch threads "
                      f"{__import__('torch').get_num_threads()}",
           "date": datetime.date.today().isoformat()}
    with tempfile.TemporaryDirectory() as tmp:
        if not args.skip_endpoint:
            doc["endpoint"] = endpoint_part(args, Path(tmp))
        if not args.skip_model:
            doc["model"] = model_part(args, Path(tmp))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    out.with_suffix(".md").write_text(markdown(doc))
    print(markdown(doc))


if __name__ == "__main__":
    main()
