"""Counterfactual capture of one step vs a plain SDPA chunked prefill of the same two contexts.

For each length n, the shipped long trajectory is repeated until it renders past n tokens
(``capture_overhead.long_trajectory``); the step is the latest one whose context fits in n tokens and
the policy mask:5.
``counterfactual`` = :func:`attnprobe.counterfactual.run.run_batch` (render both contexts, capture
both at the decision and reasoning start, analyse, write the step folder); ``plain`` = two chunked
SDPA prefills of the same token ids with no hooks. Target: ratio <= 1.15. Each mode runs
``--repeats`` times, alternating (plain, counterfactual, plain, ...); the table reports the median
time. Peak memory: the process's resident set sampled every 5 ms during each run, its peak minus
the value at the run's start (the tensors a mode allocates on top of the loaded model).

    python benchmarks/counterfactual_overhead.py --lengths 1024,2048,4096,8192,16384 --out benchmarks/results
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def rss_mib() -> float:
    """Current resident set (MiB) from /proc (Linux); else the process's peak so far."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize() / 2 ** 20
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class PeakRSS:
    """Peak resident set growth (MiB) while the block runs, sampled every 5 ms in a thread."""

    def __enter__(self):
        import threading

        self.base = self.peak = rss_mib()
        self._stop = threading.Event()

        def sample():
            while not self._stop.wait(0.005):
                self.peak = max(self.peak, rss_mib())

        self._t = threading.Thread(target=sample, daemon=True)
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()
        self.peak = max(self.peak, rss_mib())
        self.growth = self.peak - self.base


def timed(fn) -> tuple[float, float]:
    with PeakRSS() as m:
        t0 = time.perf_counter()
        fn()
        dt = time.perf_counter() - t0
    return dt, m.growth


def measure(model, n: int, chunk: int, repeats: int = 1) -> dict:
    import torch
    from capture_overhead import long_trajectory

    from attnprobe.agents.policies import mask_observations
    from attnprobe.counterfactual.contexts import build_context
    from attnprobe.counterfactual.run import RunOptions, run_batch
    from attnprobe.counterfactual.steps import choose_steps
    from attnprobe_hooks.transformers.backend import chunked_prefill

    traj = long_trajectory(n, model)
    policy = mask_observations(5)
    # the latest step whose context (prefix + step) still fits in n tokens
    step, orig = None, None
    for s in choose_steps(traj, min_past=1):
        c = build_context(model, traj, traj.messages[: s.message_index], traj.messages[s.message_index], "o",
                          rendering="auto", max_tokens=10 ** 9)
        if len(c.rendered.input_ids) > n and step is not None:
            break
        step, orig = s, c
    i = step.message_index
    cf = build_context(model, traj, policy(traj.messages[:i]).messages, traj.messages[i], "c",
                       rendering=orig.rendered.rendering, max_tokens=10 ** 9)
    out = {"tokens_original": len(orig.rendered.input_ids), "tokens_counterfactual": len(cf.rendered.input_ids)}

    def plain():
        model.model.set_attn_implementation("sdpa")
        for c in (orig, cf):
            chunked_prefill(model.model, torch.as_tensor(c.rendered.input_ids), chunk)

    def counterfactual():
        with tempfile.TemporaryDirectory() as tmp:
            run_batch(model, [step], [policy], Path(tmp), RunOptions(chunk_size=chunk, max_tokens=10 ** 9))

    runs = {"plain": [], "counterfactual": []}
    for _ in range(repeats):
        for name, fn in (("plain", plain), ("counterfactual", counterfactual)):
            runs[name].append(timed(fn))
    for name, rs in runs.items():
        out[f"{name}_seconds_all"] = [round(t, 3) for t, _ in rs]
        out[f"{name}_seconds"] = statistics.median(t for t, _ in rs)
        out[f"{name}_peak_rss_growth_mib"] = round(max(m for _, m in rs), 1)
    out["ratio"] = out["counterfactual_seconds"] / out["plain_seconds"]
    out["process_rss_mib"] = round(rss_mib(), 1)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", default="1024,2048,4096,8192,16384")
    ap.add_argument("--chunk-size", type=int, default=512)
    ap.add_argument("--repeats", default="3", help="runs per mode: one number, or one per length (e.g. 3,3,3,1,1)")
    ap.add_argument("--out", default=None, help="folder for counterfactual_overhead.json")
    args = ap.parse_args()
    import torch

    import attnprobe

    model = attnprobe.load_model("default")
    rows = []
    lengths = [int(x) for x in args.lengths.split(",")]
    reps = [int(x) for x in args.repeats.split(",")]
    reps = reps * len(lengths) if len(reps) == 1 else reps
    for n, k in zip(lengths, reps):
        if not rows:
            measure(model, 300, args.chunk_size)  # warm-up (first-call costs)
        r = {"target_tokens": n, "repeats": k, **measure(model, n, args.chunk_size, k)}
        rows.append(r)
        print(json.dumps(r), flush=True)
    meta = {"torch_threads": torch.get_num_threads(), "chunk_size": args.chunk_size, "model": model.name}
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "counterfactual_overhead.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    print("| tokens (orig / cf) | runs | plain s (median) | counterfactual s (median) | ratio | peak RSS growth "
          "plain / cf (MiB) |\n|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['tokens_original']} / {r['tokens_counterfactual']} | {r['repeats']} | {r['plain_seconds']:.1f} | "
              f"{r['counterfactual_seconds']:.1f} | {r['ratio']:.2f} | {r['plain_peak_rss_growth_mib']:.0f} / "
              f"{r['counterfactual_peak_rss_growth_mib']:.0f} |")


if __name__ == "__main__":
    main()
