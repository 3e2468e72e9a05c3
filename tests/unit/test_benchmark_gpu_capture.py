"""CI smoke test of benchmarks/gpu_capture.py: the GPU benchmark's code path, run on CPU at a tiny shape."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_capture.py"


@pytest.mark.slow
def test_gpu_capture_tiny_runs_and_reports(tmp_path, bundled_folder):
    spec = importlib.util.spec_from_file_location("gpu_capture", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.main(["--tiny", "--device", "cpu", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "gpu_capture.json").read_text())
    (row,) = data["rows"]
    assert row["shape"] == "tiny" and row["tokens"] > 2000 and row["queries"] > 10
    assert row["capture_chunk"] == 512 and row["capture_chunk_reason"] == "the default on cpu (512 tokens)"
    assert row["host_reads"] <= 16  # constant per capture, not per layer x chunk
    assert row["capture_vs_one_pass"] > 0 and row["plain_one_pass_tflops"] >= 0
    # FLOPs of the tiny shape by hand: 2 layers, hidden 128, 4 heads x 32, 2 KV heads, intermediate 256
    n = row["tokens"]
    per_layer = 128 * 128 + 2 * 128 * 64 + 128 * 128 + 3 * 128 * 256
    assert bench.prefill_flops(bench_config(bench), n) == 2 * 2 * per_layer * n + 2 * 2 * 128 * n * n
    md = (tmp_path / "gpu_capture.md").read_text()
    assert "| tiny | " in md and "host reads" in md


def bench_config(bench):
    from types import SimpleNamespace

    s = bench.SHAPES["tiny"]
    return SimpleNamespace(hidden_size=s["hidden_size"], intermediate_size=s["intermediate_size"],
                           num_hidden_layers=s["num_hidden_layers"], num_attention_heads=s["num_attention_heads"],
                           num_key_value_heads=s["num_key_value_heads"], head_dim=s["head_dim"])
