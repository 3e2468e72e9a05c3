"""Helpers for the app tests: building real data (captures of the shipped trajectories, an IBIS run on two
items, a compare table; with the tiny SmolLM2 for the page tests, the bundled model for the browser) and
reading plotly charts back."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np

from support.paths import ROOT

APP_FILE = str(ROOT / "app" / "streamlit_app.py")
# long_research is cut to its first 2048 tokens (still 5+ turns) to keep the suite fast on 2 cores.
CAPTURES = {"long_research.jsonl": 2048, "parallel_calls.jsonl": None, "reasoning_content.jsonl": None}


def build(base: Path, smol, model_args: tuple[str, ...] = ()) -> None:
    """``model_args``: the CLI's ``--model`` for the IBIS run (none: the bundled model)."""
    import attnprobe
    from attnprobe.cli.main import main

    for name, limit in CAPTURES.items():
        for traj in attnprobe.load_trajectories(ROOT / "trajectories" / name):
            res = attnprobe.capture(smol, traj, queries="reasoning", max_tokens=limit, truncate=limit is not None)
            res.save(base / "captures" / traj.id.replace("/", "_"))
    # exit code 1 = some (item, framing) pairs failed; the pages must still show the rest, and
    # test_framings_page_item_and_aggregate reports missing decisions at its end.
    # the matched protocol: the Models page's attentional gap needs the query shown to the observer
    rc = main(["ibis", "all", "--limit", "2", "--protocol", "matched", "--results", str(base / "ibis"), "--bootstrap", "200",
               "--permutations", "10", "--no-progress", "--max-new-tokens", "24", *model_args])
    assert rc in (0, 1), f"attnprobe ibis all failed (exit {rc})"
    rc = main(["compare", str(base / "ibis"), "--out", str(base / "compare"), "--plotlyjs", "cdn"])
    assert rc == 0, f"attnprobe compare failed (exit {rc})"
    (base / "BUILT").write_text("ok")


def capture_dirs(base: Path) -> list[Path]:
    return sorted(p.parent for p in (base / "captures").glob("*/meta.json"))


def ibis_folder(base: Path) -> Path:
    return next(p.parent for p in (base / "ibis").glob("*/items.jsonl"))


def decode(v):
    """A plotly JSON array (plain list or base64 typed array) as a float numpy array (None -> NaN)."""
    if isinstance(v, dict) and "bdata" in v:
        arr = np.frombuffer(base64.b64decode(v["bdata"]), dtype=np.dtype(v["dtype"]))
        if "shape" in v:
            arr = arr.reshape([int(s) for s in str(v["shape"]).split(",")])
        return arr.astype(np.float64)
    return np.asarray([[np.nan if x is None else x for x in r] if isinstance(r, list) else
                       (np.nan if r is None else r) for r in v], dtype=np.float64)


def charts(at) -> list[dict]:
    return [json.loads(c.proto.spec) for c in at.get("plotly_chart")]


def find_chart(at, pred) -> dict:
    found = [c for c in charts(at) if pred(c)]
    assert found, "chart not found"
    return found[0]


def is_heatmap(c) -> bool:
    return len(c["data"]) == 2 and all(t.get("type") == "heatmap" for t in c["data"]) and \
        c["data"][0].get("name") == "reasoning"


def is_token_strip(c) -> bool:
    return bool(c["data"]) and c["data"][0].get("type") == "bar" and "token %{x}" in c["data"][0].get(
        "hovertemplate", "")


def strip_values(c, n: int) -> np.ndarray:
    out = np.zeros(n)
    for t in c["data"]:
        out[decode(t["x"]).astype(int)] = decode(t["y"])
    return out
