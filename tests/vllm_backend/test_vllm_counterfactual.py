"""A counterfactual run on vLLM (fp32, CPU; every context of several steps in one generate, sharing their
common prefixes through the engine's prefix cache) agrees with the transformers backend within 1e-4 on
every stored number."""

from __future__ import annotations

import logging
import re

import numpy as np
import pytest

pytest.importorskip("vllm.sampling_params", reason="the vLLM backend tests need vLLM (run .ci/vllm.sh)")

TOL = 1e-4


def test_counterfactual_vllm_matches_transformers(smol_folder, shipped, tmp_path, caplog):
    from support.cfrun import run_counterfactuals

    import attnprobe
    from attnprobe.agents.policies import ircot, mask_observations
    from attnprobe.counterfactual.run import RunOptions
    from attnprobe.counterfactual.store import iter_records, load_step
    from attnprobe_hooks.vllm import backend as vllm_backend

    traj = next(t for t in shipped if t.id == "sample-long-research")
    policies = [mask_observations(3), ircot("oq")]
    tm = attnprobe.load_model(str(smol_folder), backend="transformers", dtype="float32")
    run_counterfactuals(tm, [traj], policies, tmp_path / "tf", turns=[5, 6], batch_size=2,
                        opts=RunOptions(chunk_size=256))
    vm = attnprobe.load_model(str(smol_folder), backend="vllm", dtype="float32", chunk_size=256)
    try:
        caplog.clear()  # (the transformers run above logged its own line)
        with caplog.at_level(logging.INFO, logger="attnprobe.counterfactual.run"):
            counts = run_counterfactuals(vm, [traj], policies, tmp_path / "vl", turns=[5, 6], batch_size=2,
                                         opts=RunOptions(chunk_size=256))
    finally:
        vllm_backend.unload(vm)
    assert counts["done"] == 2 and counts["failed"] == 0
    # the engine's prefix cache served the contexts' common prefixes (a step's original extends the
    # previous one; the policies' contexts branch off them): far fewer tokens prefilled than in the plans
    lines = [r.getMessage() for r in caplog.records if "reuse" in r.getMessage()]
    assert len(lines) == 1 and "(prefix sharing)" in lines[0], lines
    m = re.search(r"(\d+) plans, ([0-9,]+) tokens; prefilled ([0-9,]+) \(trie ([0-9,]+)\)", lines[0])
    plans, tokens, prefilled, trie = (int(x.replace(",", "")) for x in m.groups())
    print(lines[0])
    # a hit covers whole 128-token blocks: at most one partial block per plan is prefilled beyond the trie
    assert trie <= prefilled < tokens and prefilled - trie < 128 * plans
    tf = {(r["policy"], r["step_message_index"]): r for r in iter_records(tmp_path / "tf")}
    vl = {(r["policy"], r["step_message_index"]): r for r in iter_records(tmp_path / "vl")}
    assert tf.keys() == vl.keys() and len(tf) == 4
    for key, a in tf.items():
        b = vl[key]
        assert a["changes"] == b["changes"] and a["tokens"] == b["tokens"]
        for q in a["queries"]:
            assert abs(a["queries"][q]["removed_mass"] - b["queries"][q]["removed_mass"]) <= TOL
            for g, v in a["queries"][q]["redistribution"].items():
                assert abs(v - b["queries"][q]["redistribution"][g]) <= TOL, (key, q, g)
    for d in (tmp_path / "tf").glob("*/*/step_*"):
        _, xa = load_step(d)
        _, xb = load_step(tmp_path / "vl" / d.relative_to(tmp_path / "tf"))
        for name in ("mass_original", "mass_counterfactual"):
            assert float(np.abs(xa[name] - xb[name]).max()) <= TOL, name
