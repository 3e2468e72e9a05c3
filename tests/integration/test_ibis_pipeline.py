"""End to end: behaviour, capture, report, resume, compare (one item, few tokens), and the chat's batching and
sharing. On the tiny random-weight SmolLM2 (support/tiny_model.py: the bundled tokenizer, template and head
layout, 4 layers), so prompts and token counts are the bundled model's; the bundled model's own IBIS numbers
are pinned by tests/integration/test_baseline.py::test_ibis_six_item_run_is_unchanged."""

from __future__ import annotations

import json

import numpy as np
from support.paths import ROOT  # noqa: E402

from attnprobe.cli.main import main
from attnprobe.generation.transformers_chat import TransformersChat
from attnprobe.studies.ibis.attention import load_attention
from attnprobe.studies.ibis.behaviour import DECISIONS, BehaviourBackend, read_decisions
from attnprobe.studies.ibis.framings import CATEGORIES, FRAMINGS, build_framing
from attnprobe.studies.ibis.items import load_items

SHIPPED = ROOT / "trajectories" / "ibis_items.jsonl"


def test_full_pipeline_one_item(tiny_smol, tiny_smol_folder, tmp_path, capsys):
    smol = tiny_smol
    folder = tmp_path / "smol"
    model = ["--model", str(tiny_smol_folder)]
    args = ["ibis", "all", "--ids", "sci-01", "--folder", str(folder), "--max-new-tokens", "4", "--prompts-per-batch", "3",
            "--bootstrap", "200", "--permutations", "5", "--plotlyjs", "cdn", "--no-progress", *model]
    assert main(args) == 0  # reuses the session's loaded model (load_model caches per process)
    for name in ("run.json", "items.jsonl", "framings.jsonl", "decisions.jsonl", "attention.safetensors",
                 "attention.json", "metrics.json", "report.md", "report.html"):
        assert (folder / name).is_file(), name
    assert not list(folder.rglob("*.pkl")) and not list(folder.rglob("*.pt"))
    recs = read_decisions(folder / "decisions.jsonl")
    assert sorted(r["framing"] for r in recs) == sorted(FRAMINGS)
    for r in recs:
        assert r["decision"] in DECISIONS and r["output_tokens"] <= 4 and r["backend"] == "transformers"
        fc = r["forced_choice"]
        if r["framing"] == "direct":  # the paper's direct mode is the filter prompt: no {"name": " readout there
            assert fc is None and r["forced_choice_control"] is None
            continue
        assert fc["choice"] in ("web_search", "visit_page")
        assert np.isclose(fc["log_odds_visit"], fc["logprob_visit_page"] - fc["logprob_web_search"], atol=1e-4)
        # the copy control (own call renamed) exists for the agentic framing only, and changes the prompt
        ctl = r["forced_choice_control"]
        assert (ctl is not None) == (r["framing"] == "agentic")
        if ctl:
            assert ctl["own_tool"] == "google_search" and ctl["log_odds_visit"] != fc["log_odds_visit"]
    # attention arrays: one item, every category, all layers and heads; masses sum to 1 per head
    index, arrays = load_attention(folder)
    assert index["items"] == ["sci-01"] and index["categories"] == list(CATEGORIES)
    assert index["protocol"] == "paper" and json.loads((folder / "run.json").read_text())["protocol"] == "paper"
    for fr in FRAMINGS:
        m = arrays[f"mass.{fr}"]
        assert m.shape == (1, len(CATEGORIES), smol.num_layers, index["num_heads"])
        assert np.allclose(m.sum(axis=1), 1.0, atol=1e-3)
        t = arrays[f"tokens.{fr}"]
        assert t.shape == (1, len(CATEGORIES)) and (t[0, CATEGORIES.index("results")] > 50)
        assert (t[0, CATEGORIES.index("call")] > 0) == (fr == "agentic")
    metrics = json.loads((folder / "metrics.json").read_text())
    b, a = metrics["behaviour"], metrics["attention"]
    assert b["decisions_total"] == 3 and "inertia_gap" in b and "forced_choice" in b
    assert b["unparseable_total"] == sum(e["unparseable"] for fr in b["accuracy"].values()
                                         for s, e in fr.items() if s != "headline")
    # the paper's observer shows no query: no own-vs-external query gap, said so; results heads remain
    assert metrics["protocol"] == "paper" and a["attentional_gap"]["gap"] is None
    assert "observer framing shows no query" in a["attentional_gap"]["reason"]
    assert "query" not in a["heads"] and len(a["heads"]["results"]["top"]) == 10
    q = a["by_category"]["headline"]["query"]
    assert q["observer"] == 0.0 and q["agentic"] > 0  # the own query tokens exist only in the agentic framing
    assert "plotly" in (folder / "report.html").read_text()
    out = capsys.readouterr().out
    assert "IBIS report" in out and "**Attentional gap** (query tokens, length-matched): not defined here" in out
    # resume: nothing is redone
    capsys.readouterr()
    assert main(["ibis", "run", "--ids", "sci-01", "--folder", str(folder), "--max-new-tokens", "4",
                 "--no-progress", *model]) == 0
    assert "0 decided, 3 already done" in capsys.readouterr().err
    # a folder holds one protocol: resuming it with another is refused (exit 2, the message says which)
    assert main(["ibis", "run", "--ids", "sci-01", "--folder", str(folder), "--protocol", "matched",
                 "--no-progress", *model]) == 2
    assert "holds a --protocol paper run; this one is --protocol matched" in capsys.readouterr().err
    # compare across model folders (the same folder twice under two names is enough for the table)
    other = tmp_path / "copy"
    other.mkdir()
    m2 = dict(metrics, model="copy-model")
    (other / "metrics.json").write_text(json.dumps(m2))
    assert main(["compare", str(folder), str(other), "--out", str(tmp_path / "cmp"), "--plotlyjs", "cdn"]) == 0
    table = (tmp_path / "cmp" / "compare.md").read_text()
    assert "tiny-smollm2" in table and "copy-model" in table
    rows = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    assert rows[0]["attentional_gap"] == metrics["attention"]["attentional_gap"]["gap"]
    assert "plotly" in (tmp_path / "cmp" / "compare.html").read_text()


def test_batched_generation_equals_single(tiny_smol):
    """The one chat's left-padded batch equals one-by-one generation (raw text, tokens, finish), and
    IBIS's adapter keeps its finish reasons and prompt text for both."""
    smol = tiny_smol
    it = load_items(SHIPPED)[3]
    trajs = [build_framing(it, fr) for fr in FRAMINGS]
    chat = TransformersChat(smol, stop_at_call=False)
    batched = chat.complete_many([(t.messages, t.tools) for t in trajs], max_new_tokens=5)
    for i in (0, 1):
        single = chat.complete(trajs[i].messages, trajs[i].tools, max_new_tokens=5)
        assert batched[i].raw_text == single.raw_text
        assert (batched[i].input_tokens, batched[i].output_tokens, batched[i].stopped_by) == (
            single.input_tokens, single.output_tokens, single.stopped_by)
        assert batched[i].prompt == single.prompt
    adapter = BehaviourBackend(chat, early_stop=False, forced_choice=False)
    many = adapter.complete_many(trajs, max_new_tokens=5)
    one = adapter.complete(trajs[1], max_new_tokens=5)
    assert many[1]["raw_text"] == one["raw_text"] and many[1]["input_tokens"] == one["input_tokens"]
    assert many[1]["prompt_text"] == one["prompt_text"] and one["tool_calls"] == []
    assert many[1]["finish_reason"] in ("stop", "length")


def test_stop_at_call_is_a_prefix_of_the_full_generation(tiny_smol):
    """Greedy: stopping once a complete call of a known tool is written keeps a prefix of the full reply."""
    smol = tiny_smol
    it = load_items(SHIPPED)[0]
    traj = build_framing(it, "agentic")
    full = TransformersChat(smol, stop_at_call=False).complete(traj.messages, traj.tools, max_new_tokens=40)
    early = TransformersChat(smol, stop_names=["web_search", "visit_page"], stop_check_every=1).complete(
        traj.messages, traj.tools, max_new_tokens=40)
    assert full.raw_text.startswith(early.raw_text) and early.output_tokens <= full.output_tokens


def test_shared_prefix_captures_equal_one_at_a_time(tiny_smol, tmp_path, caplog):
    """Two items x three framings in one sharing pass (system prompt and tools prefilled once) equal
    the six captures made one at a time within 1e-5 on every stored array, and the pass prefilled
    fewer tokens than its plans hold."""
    smol = tiny_smol
    import logging

    import numpy as np

    from attnprobe.resources import data_path
    from attnprobe.results.result import CaptureResult
    from attnprobe.studies.ibis.attention import run_attention
    from attnprobe.studies.ibis.items import load_items
    from attnprobe.studies.ibis.jobs import capture_dir

    items = load_items(data_path("ibis_items.jsonl"))[:2]
    with caplog.at_level(logging.INFO, logger="attnprobe.capture.api"):
        assert run_attention(smol, items, tmp_path / "shared", progress=False, batch_size=6)["captured"] == 6
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("capture batch:"))
    plan_tokens, prefilled = (int(x.replace(",", "")) for x in
                              (line.split("plans, ")[1].split(" tokens")[0], line.split("prefilled ")[1].split(" ")[0]))
    assert "reuse" in line and prefilled < plan_tokens
    assert run_attention(smol, items, tmp_path / "alone", progress=False, batch_size=1)["captured"] == 6
    for it in items:
        for fr in ("agentic", "observer", "direct"):
            a = CaptureResult.load(capture_dir(tmp_path / "shared", it.id, fr))
            b = CaptureResult.load(capture_dir(tmp_path / "alone", it.id, fr))
            np.testing.assert_array_equal(a.input_ids, b.input_ids)
            assert a.segments == b.segments and a.meta["ibis"] == b.meta["ibis"]
            for name in ("segment_attention", "layer_head_attention", "token_attention"):
                np.testing.assert_allclose(getattr(a, name), getattr(b, name), rtol=0, atol=1e-5, err_msg=name)
