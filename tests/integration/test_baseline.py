"""No behaviour change across refactors: the numbers recorded in tests/data/baseline/ (before the
architecture refactor, see its README) are reproduced.

Captures are compared array by array. They were bit-identical when recorded and re-checked on the
same machine kind; the test allows 1e-7 (probabilities are <= 1) only so that a CPU with another
vector ISA, whose float summation order differs, does not fail it. IBIS metrics are compared number
by number within 1e-7 (statistics moved from hand-written loops to scipy/scikit-learn).
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from safetensors.numpy import load_file
from support.paths import ROOT, TRAJ_DIR

BASE = ROOT / "tests" / "data" / "baseline"
TOL = 1e-7
# Fields that legitimately differ between runs: wall times, paths, versions.
VOLATILE = {"seconds", "capture_seconds", "time", "folder", "items_source", "python", "attnprobe_version",
            "model_path", "hook_seconds", "batch_seconds", "generated_at", "elapsed_seconds"}


def _compare(got, want, path="") -> list[str]:
    """Differences between two JSON values (numbers within TOL)."""
    key = path.rsplit("/", 1)[-1]
    if key in VOLATILE:
        return []
    if isinstance(want, dict):
        if not isinstance(got, dict):
            return [f"{path}: {type(got).__name__} instead of an object"]
        out = [f"{path}/{k}: missing" for k in want if k not in got and k not in VOLATILE]
        for k in want:
            if k in got:
                out += _compare(got[k], want[k], f"{path}/{k}")
        return out
    if isinstance(want, list):
        if not isinstance(got, list) or len(got) != len(want):
            return [f"{path}: list of {len(got) if isinstance(got, list) else '?'} instead of {len(want)}"]
        return [d for i, (g, w) in enumerate(zip(got, want)) for d in _compare(g, w, f"{path}[{i}]")]
    if isinstance(want, float) and isinstance(got, (int, float)) and not isinstance(got, bool):
        if math.isnan(want) and math.isnan(got):
            return []
        return [] if abs(got - want) <= TOL else [f"{path}: {got!r} != {want!r}"]
    return [] if got == want else [f"{path}: {got!r} != {want!r}"]


def test_compare_finds_differences():
    assert _compare({"a": [1.0, 2.0], "seconds": 3}, {"a": [1.0, 2.0 + 1e-6], "seconds": 9}) == [
        "/a[1]: 2.0 != 2.000001"]
    assert _compare({"a": 1}, {"a": 1, "b": 2}) == ["/b: missing"]


@pytest.mark.slow
def test_captures_of_the_shipped_trajectories_are_unchanged(smol, tmp_path):
    from attnprobe.cli.main import main

    files = [str(TRAJ_DIR / f) for f in ("long_research.jsonl", "parallel_calls.jsonl", "reasoning_content.jsonl")]
    assert main(["-q", "capture", *files, "--out", str(tmp_path), "--queries", "reasoning+decision"]) == 0
    wanted = sorted(BASE.glob("capture/*.safetensors"))
    assert len(wanted) == 4
    for ref in wanted:
        name = ref.stem
        got, want = load_file(str(tmp_path / name / "scores.safetensors")), load_file(str(ref))
        assert sorted(got) == sorted(want), name
        for key, arr in want.items():
            assert got[key].shape == arr.shape and got[key].dtype == arr.dtype, (name, key)
            if arr.dtype.kind == "f":
                diff = float(np.max(np.abs(got[key] - arr))) if arr.size else 0.0
                assert diff <= TOL, f"{name}/{key}: max |diff| {diff:.3g}"
            else:
                np.testing.assert_array_equal(got[key], arr, err_msg=f"{name}/{key}")
        meta = json.loads((tmp_path / name / "meta.json").read_text())
        layout = json.loads((BASE / "capture" / f"{name}.json").read_text())
        assert _compare({k: meta[k] for k in layout}, layout) == [], name


@pytest.mark.slow
def test_ibis_six_item_run_is_unchanged(smol, tmp_path):
    from attnprobe.cli.main import main

    rc = main(["-q", "ibis", "all", "--limit", "6", "--results", str(tmp_path), "--no-progress", "--protocol", "matched",
               "--bootstrap", "2000", "--permutations", "50", "--max-new-tokens", "64"])
    assert rc == 0
    folder = next(p.parent for p in tmp_path.glob("*/metrics.json"))
    want = json.loads((BASE / "ibis" / "metrics.json").read_text())
    got = json.loads((folder / "metrics.json").read_text())
    diffs = _compare(got, want)
    assert diffs == [], "\n".join(diffs[:20])
    keys = ("item_id", "framing", "decision", "method", "correct", "raw_text", "input_tokens", "output_tokens",
            "forced_choice", "rendering")
    got_dec = sorted((json.loads(x) for x in (folder / "decisions.jsonl").read_text().split("\n") if x.strip()),
                     key=lambda r: (r["item_id"], r["framing"]))
    want_dec = sorted((json.loads(x) for x in (BASE / "ibis" / "decisions.jsonl").read_text().split("\n")
                       if x.strip()), key=lambda r: (r["item_id"], r["framing"]))
    assert len(got_dec) == len(want_dec) == 18
    for g, w in zip(got_dec, want_dec):
        assert _compare({k: g.get(k) for k in keys}, {k: w.get(k) for k in keys}) == [], (w["item_id"], w["framing"])
    got_att, want_att = load_file(str(folder / "attention.safetensors")), load_file(str(BASE / "ibis" /
                                                                                        "attention.safetensors"))
    assert sorted(got_att) == sorted(want_att)
    for key, arr in want_att.items():
        assert float(np.max(np.abs(got_att[key] - arr))) <= TOL, key
