"""Per-step counterfactual capture with the bundled model: conservation, turn mapping, a no-op policy
that reproduces the original rows exactly, actions, and the resumable CLI on a shipped trajectory."""

from __future__ import annotations

import numpy as np
import pytest
from support.cfrun import run_counterfactuals
from support.messages import call

from attnprobe.agents.policies import ircot, make_policy, mask_observations, refine_latest
from attnprobe.agents.refiners import bm25_refiner
from attnprobe.counterfactual.analysis import CF_ROLES, GROUPS
from attnprobe.counterfactual.run import RunOptions
from attnprobe.counterfactual.steps import choose_steps
from attnprobe.counterfactual.store import iter_records, load_step
from attnprobe.counterfactual.summary import markdown_table, summarize
from attnprobe.results.result import CaptureResult
from attnprobe.trajectory.schema import Trajectory


def small_trajectory() -> Trajectory:
    msgs = [{"role": "system", "content": "You are a search agent. Use the tools."},
            {"role": "user", "content": "Task: which chemist named holmium, and after which city?"}]
    facts = ["Holmium is element 67. It was found in 1878.", "Error: page timed out",
             "Per Teodor Cleve was a Swedish chemist.", "Holmia is the Latin name of Stockholm. Trams are blue.",
             "Cleve named holmium after Holmia. Thulium came from Thule."]
    for j, fact in enumerate(facts):
        msgs.append({"role": "assistant", "content": f"Step {j}: I search again.",
                     "tool_calls": [call(f"c{j}", "web_search", query=f"holmium Cleve {j}")]})
        msgs.append({"role": "tool", "tool_call_id": f"c{j}", "content": fact})
    msgs.append({"role": "assistant", "content": "Now I can answer.",
                 "tool_calls": [call("c9", "final_answer", answer="Cleve, Stockholm")]})
    tools = [{"type": "function", "function": {"name": n, "parameters": {"type": "object", "properties": {}}}}
             for n in ("web_search", "final_answer")]
    return Trajectory(id="cf-small", messages=msgs, tools=tools)


POLICIES = [mask_observations(1), ircot("o"), ircot("oq"), ircot("oqp"), refine_latest(bm25_refiner(1), name="refine")]


pytestmark = pytest.mark.slow  # ~1.5 min on an idle 2-core machine (model load, 12 captures, 11 short generations)


@pytest.fixture(scope="module")
def small_run(tiny_smol, tmp_path_factory):
    smol = tiny_smol  # structure and equalities only: the tiny random-weight SmolLM2 (same tokenizer)
    out = tmp_path_factory.mktemp("cf")
    traj = small_trajectory()
    noop = make_policy("noop", lambda msgs: {})
    counts = run_counterfactuals(smol, [traj], [*POLICIES, noop], out, turns=[5],
                                 opts=RunOptions(actions=True, max_new_tokens=24))
    return out, traj, counts


def test_steps_are_reasoning_steps_with_enough_past_turns(small_run):
    _, traj, counts = small_run
    assert [(s.message_index, s.turn) for s in choose_steps(traj)] == [(12, 5)]
    assert [s.turn for s in choose_steps(traj, min_past=3)] == [3, 4, 5]
    assert counts == {"done_before": 0, "done": 1, "failed": 0}


def test_conservation_within_1e5(small_run):
    out, _, _ = small_run
    records = list(iter_records(out))
    assert sorted(r["policy"] for r in records) == sorted(["mask-obs:1", "ircot:o", "ircot:oq", "ircot:oqp", "refine", "noop"])
    for r in records:
        for q in r["queries"].values():
            assert abs(q["original_total"] - 1) < 1e-5 and abs(q["counterfactual_total"] - 1) < 1e-5
            # issue 26: the redistribution sums to the mass on changed messages; the removed mass (absent
            # tokens) is part of it
            assert abs(q["kept_mass"] + q["changed_message_mass"] - 1) < 1e-5
            assert abs(sum(q["redistribution"].values()) - q["changed_message_mass"]) < 1e-5
            assert abs(sum(q["removed_by_message"].values()) - q["changed_message_mass"]) < 1e-6
            assert q["removed_mass"] <= q["changed_message_mass"] + 1e-9
            for g in GROUPS:
                assert q["redistribution"][g] == pytest.approx(q["counterfactual"][g] - q["original_kept"][g])
            if r["policy"] != "noop":
                assert q["removed_mass"] > 0.0


def test_noop_policy_reproduces_the_original_rows(small_run):
    out, _, _ = small_run
    step = next(p.parent for p in out.glob("*/noop*/step_*/record.json"))
    record, arrays = load_step(step)
    orig, cf = CaptureResult.load(step / "original"), CaptureResult.load(step / "counterfactual")
    n = len(cf.input_ids)
    assert np.array_equal(orig.input_ids[:n], cf.input_ids)
    np.testing.assert_allclose(orig.token_attention[:, :n], cf.token_attention, atol=1e-6)
    np.testing.assert_allclose(arrays["mass_original"], arrays["mass_counterfactual"], atol=1e-6)
    for q in record["queries"].values():
        assert q["removed_mass"] == 0 and all(abs(v) < 1e-6 for v in q["redistribution"].values())
    assert record["tokens"]["saved"] == 0 and record["decision_exact"] == {"original": True, "counterfactual": True}
    a = record["action"]
    assert a["original"] == a["counterfactual"] and a["changed"] is False  # same context, greedy: same reply


def test_removed_mass_is_the_mass_of_the_removed_messages(small_run):
    """ircot:oqp removes messages 2..11 whole: the removed mass is the original attention on every token
    those messages own; mask-obs:1 masks 3, 7 (5 is an error) and their placeholders keep turns 0 and 2."""
    out, _, _ = small_run
    step = next(p.parent for p in out.glob("*/ircot_oqp*/step_*/record.json"))
    record, arrays = load_step(step)
    orig = CaptureResult.load(step / "original")
    assert record["changes"] == {**{str(i): "kept" for i in (0, 1)}, **{str(i): "removed" for i in range(2, 10)},
                                 "10": "kept", "11": "kept"}
    seg_mass = sum(orig.segment_attention[0, k] for k, s in enumerate(orig.segments) if 2 <= s.message_index <= 9)
    removed = record["queries"]["decision"]["changed_message_mass"]
    assert record["queries"]["decision"]["removed_mass"] == pytest.approx(removed, abs=1e-9)  # whole: all absent
    template = sum(orig.segment_attention[0, k] for k, s in enumerate(orig.segments) if s.role == "template")
    assert seg_mass <= removed + 1e-6 and removed <= seg_mass + template + 1e-6
    np.testing.assert_allclose(orig.token_attention[0][arrays["removed_tokens"].astype(bool)].sum(), removed, atol=1e-6)

    step = next(p.parent for p in out.glob("*/mask-obs_1*/step_*/record.json"))
    record, arrays = load_step(step)
    assert [k for k, v in record["changes"].items() if v != "kept"] == ["3", "7", "9"]  # 5 is an error, 11 latest
    for q in record["queries"].values():  # only observations were masked; in the original they are observations
        assert q["changed_observation_mass"] == pytest.approx(q["changed_message_mass"], abs=1e-7)
        assert q["removed_observation_mass"] == pytest.approx(q["removed_mass"], abs=1e-7)
        assert q["removed_mass"] < q["changed_message_mass"]  # the masked messages' markers stay
        assert q["original"]["placeholder"] == 0 and q["counterfactual"]["placeholder"] > 0
    roles, turns = arrays["counterfactual_roles"], arrays["counterfactual_turns"]
    ph = roles == CF_ROLES.index("placeholder")
    assert sorted(set(turns[ph].tolist())) == [0, 2, 3]  # observations of turns 0, 2, 3 keep their turn index
    m = arrays["mass_counterfactual"]
    assert m[:, :, CF_ROLES.index("placeholder")].sum(axis=1) == pytest.approx(
        [record["queries"][q]["counterfactual"]["placeholder"] for q in ("decision", "reasoning")], abs=1e-6)
    # the short observations here are shorter than their placeholders: masking costs tokens
    assert record["tokens"]["saved"] == record["tokens"]["original"] - record["tokens"]["counterfactual"] < 0


def test_summary_table(small_run):
    out, _, _ = small_run
    s = summarize(iter_records(out), n_boot=200)
    assert s["noop"]["decision"]["removed_mass"]["mean"] == 0
    assert s["ircot:oqp"]["decision"]["removed_mass"]["mean"] > s["ircot:o"]["decision"]["removed_mass"]["mean"]
    assert s["noop"]["action"]["changed"] == 0 and s["noop"]["action"]["n"] == 1
    assert s["ircot:oqp"]["tokens_saved"]["mean"] > s["ircot:oq"]["tokens_saved"]["mean"] > 0
    assert s["refine"]["decision"]["redistribution"]["refined"]["mean"] > 0
    assert all(v["decision"]["conservation_error"] < 1e-5 for v in s.values())
    table = markdown_table(s)
    assert table.count("\n") == 2 + len(s) and "| ircot:oqp | 1 |" in table


def test_next_actions_from_the_captured_cache_equal_full_generation(small_run, tiny_smol, tmp_path):
    """The run above generated every next action from the capture's cache (1 token prefilled each);
    the same steps without prefix sharing generate with ``chat.complete`` (the whole prompt
    prefilled): identical text, call and decision."""
    smol = tiny_smol
    out, traj, _ = small_run
    shared = {r["policy"]: r["action"] for r in iter_records(out)}
    run_counterfactuals(smol, [traj], [ircot("oq"), mask_observations(1)], tmp_path, turns=[5],
                        opts=RunOptions(actions=True, max_new_tokens=24, share_prefixes=False))
    plain = {r["policy"]: r["action"] for r in iter_records(tmp_path)}
    assert sorted(plain) == ["ircot:oq", "mask-obs:1"]
    for name, a in plain.items():
        for side in ("original", "counterfactual"):
            got, want = dict(shared[name][side]), dict(a[side])
            g, w = got.pop("generation"), want.pop("generation")
            assert got == want
            assert g["prompt_tokens"] == w["prompt_tokens"] == w["prefilled_tokens"] > 100
            assert g["prefilled_tokens"] == 1
    assert shared["ircot:oq"]["counterfactual"]["generation"]["prompt_tokens"] < \
        shared["ircot:oq"]["original"]["generation"]["prompt_tokens"]
