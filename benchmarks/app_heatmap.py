"""How fast does the app draw a 500-turn heatmap from stored scores?

Synthesizes a CaptureResult with realistic shapes (500 turns, 4 segments per turn = 2000
segments, SmolLM2's 30 layers x 9 heads, one reasoning-start query per turn), saves it, and times
what the Trajectory page does per view: analysis.heatmap() on the loaded result, building the
plotly figure, and serializing it to the JSON Streamlit sends to the browser. Loading is timed
separately (the app caches loaded results, so it is paid once per run, not per view).

    python benchmarks/app_heatmap.py [--turns 500] [--layers 30] [--heads 9] [--repeat 5]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def synth(turns: int, layers: int, heads: int, tokens_per_turn: int = 40, seed: int = 0):
    from attnprobe.render.segments import QueryPoint, Segment
    from attnprobe.results.result import CaptureResult

    rng = np.random.default_rng(seed)
    segs, queries, pos = [], [], 0
    text = ""
    for t in range(turns):
        for role, author, n in (("template", "external", 4), ("reasoning", "self", tokens_per_turn // 2),
                                ("tool_call", "self", 6), ("observation", "external", tokens_per_turn)):
            if t == 0 and role == "reasoning":
                role, author = "task", "external"
            segs.append(Segment(role=role, author=author, turn=t, message_index=t, start=pos, end=pos + n))
            if role == "reasoning":
                queries.append(QueryPoint(position=pos, kind="reasoning", turn=t, message_index=t))
            pos += n
    n_tok = pos
    words = [f"w{i % 97} " for i in range(n_tok)]
    text = "".join(words)
    ends = np.cumsum([len(w) for w in words])
    offsets = np.stack([ends - np.asarray([len(w) for w in words]), ends - 1], axis=1)
    S, Q = len(segs), len(queries)
    seg_turn = np.asarray([s.turn for s in segs])
    lh = rng.random((Q, layers, heads, S), dtype=np.float32)
    qturn = np.asarray([q.turn for q in queries])
    lh *= (seg_turn[None, None, None, :] <= qturn[:, None, None, None])  # causal
    lh /= lh.sum(axis=-1, keepdims=True)
    tok = np.zeros((Q, n_tok), dtype=np.float32)
    for qi, q in enumerate(queries):
        tok[qi, : q.position + 1] = rng.random(q.position + 1, dtype=np.float32)
        tok[qi] /= tok[qi].sum()
    return CaptureResult(trajectory_id="synthetic-500", input_ids=np.zeros(n_tok, dtype=np.int64), segments=segs,
                         queries=queries, layers=list(range(layers)), segment_attention=lh.mean(axis=(1, 2)),
                         layer_head_attention=lh, token_attention=tok, meta={"model": "synthetic"}, text=text,
                         offsets=offsets)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--turns", type=int, default=500)
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--heads", type=int, default=9)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()

    import plotly.io as pio

    from app import data as D
    from attnprobe.results import figures as F
    from attnprobe.results.analysis import heatmap as current

    res = synth(args.turns, args.layers, args.heads)
    with tempfile.TemporaryDirectory() as tmp:
        res.save(Path(tmp) / "synthetic")
        t0 = time.perf_counter()
        loaded = D.load_capture(Path(tmp), "synthetic")
        texts = loaded.turn_texts()
        t_load = time.perf_counter() - t0
    print(f"synthetic capture: {args.turns} turns, {len(loaded.segments)} segments, {len(loaded.input_ids)} tokens, "
          f"{len(loaded.queries)} queries, layer_head_attention {loaded.layer_head_attention.shape} "
          f"({loaded.layer_head_attention.nbytes / 2**20:.0f} MiB)")
    print(f"load + turn texts (once per run, cached by the app): {t_load:.2f} s")
    variants = [("analysis.heatmap", current)]
    for (name, heatmap), (label, layer, head) in [(v, c) for v in variants for c in (
            ("mean of layers and heads", None, None), ("one layer, one head", 3, 4))]:
        times, sizes = [], []
        for _ in range(args.repeat):
            c0 = time.process_time()
            t0 = time.perf_counter()
            hm = heatmap(loaded, layer, head)
            t1 = time.perf_counter()
            fig = F.heatmap_figure(hm, texts)
            t2 = time.perf_counter()
            js = pio.to_json(fig, validate=False)
            t3 = time.perf_counter()
            times.append((t1 - t0, t2 - t1, t3 - t2, t3 - t0, time.process_time() - c0))
            sizes.append(len(js))
        med = np.median(np.asarray(times), axis=0)
        print(f"{name} ({label}): math {1000 * med[0]:.0f} ms + figure {1000 * med[1]:.0f} ms + "
              f"JSON {1000 * med[2]:.0f} ms = {1000 * med[3]:.0f} ms wall, {1000 * med[4]:.0f} ms CPU (median of {args.repeat}); figure JSON "
              f"{sizes[0] / 2**20:.2f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
