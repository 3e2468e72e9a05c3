"""Issue 19 items 1, 2, 9: masking by observations and by turns with parallel calls and errors,
refiners per round, the refined message's dropped / kept-again split, policy parser errors and the
default --min-past per policy family. Hand-built inputs with known answers."""

from __future__ import annotations

import numpy as np
import pytest
from support.messages import call

from attnprobe.agents.policies import (
    compose,
    default_min_past,
    extractive_selection,
    mask_observations,
    mask_turns,
    parse_policy,
    refine_latest,
    refine_rounds,
)
from attnprobe.agents.refiners import split_sentences
from attnprobe.counterfactual.refined import refined_mass_split, sentence_spans, split_mass, token_sentences
from attnprobe.render.segments import QueryPoint, Segment
from attnprobe.results.result import CaptureResult

ERR = "Error: timeout after 30 s"
MSGS = [
    {"role": "system", "content": "You are a search agent."},  # 0
    {"role": "user", "content": "Task: who named holmium?"},  # 1
    {"role": "assistant", "content": "Search.", "tool_calls": [call("c0", "web_search", query="holmium")]},  # 2
    {"role": "tool", "tool_call_id": "c0", "content": "Holmium is a metal. Named by Cleve."},  # 3
    {"role": "assistant", "content": "Two.", "tool_calls": [call("c1", "visit_page", url="https://h.org"),
                                                           call("c2", "web_search", query="Cleve")]},  # 4
    {"role": "tool", "tool_call_id": "c1", "content": ERR},  # 5 (error)
    {"role": "tool", "tool_call_id": "c2", "content": "Cleve was Swedish. He was a chemist."},  # 6
    {"role": "assistant", "content": "Four at once.",
     "tool_calls": [call("c3", "web_search", query="Holmia"), call("c4", "web_search", query="Stockholm"),
                    call("c5", "visit_page", url="https://x.org"), call("c6", "web_search", query="1879")]},  # 7
    {"role": "tool", "tool_call_id": "c3", "content": "Holmia is Latin. It means Stockholm."},  # 8
    {"role": "tool", "tool_call_id": "c4", "content": "Stockholm is a capital. It is in Sweden."},  # 9
    {"role": "tool", "tool_call_id": "c5", "content": "Error: 404 not found"},  # 10 (error)
    {"role": "tool", "tool_call_id": "c6", "content": "In 1879 Cleve named it. The year was busy."},  # 11
    {"role": "assistant", "content": "Once more.", "tool_calls": [call("c7", "visit_page", url="https://y.org")]},  # 12
    {"role": "tool", "tool_call_id": "c7", "content": "Error: connection refused"},  # 13 (error-only turn)
]
OBS = [3, 5, 6, 8, 9, 10, 11, 13]


def masked(cf):
    return cf.indices("placeholder")


def test_mask_counts_observations_errors_exempt_and_free():
    # Non-error observations 3, 6, 8, 9, 11: the two most recent (9, 11) stay, even though the newest
    # turn (message 7) made four parallel calls: mask:K counts tool messages, so 8 is masked.
    assert masked(mask_observations(2)(MSGS)) == [3, 6, 8]
    # Errors 5, 10, 13 never masked and use no slot: mask:3 keeps 8, 9, 11 (not 10, 11, 13).
    assert masked(mask_observations(3)(MSGS)) == [3, 6]
    assert masked(mask_observations(0)(MSGS)) == [3, 6, 8, 9, 11]
    # Without the exemption errors are ordinary observations.
    assert masked(mask_observations(2, keep_errors=False)(MSGS)) == [3, 5, 6, 8, 9, 10]


def test_mask_turns_keeps_parallel_calls_together_and_error_only_turns_use_no_slot():
    # Turns with a non-error observation: messages 2 {3}, 4 {6}, 7 {8, 9, 11}; turn 12 has only an error.
    assert masked(mask_turns(1)(MSGS)) == [3, 6]  # all four parallel observations of turn 7 stay
    assert masked(mask_turns(2)(MSGS)) == [3]
    assert masked(mask_turns(3)(MSGS)) == []
    assert masked(mask_turns(0)(MSGS)) == [3, 6, 8, 9, 11]
    assert masked(mask_turns(1, keep_errors=False)(MSGS)) == [3, 5, 6, 8, 9, 10, 11]  # turn 12 takes the slot
    cf = mask_turns(1)(MSGS)
    assert cf.messages[6]["content"].startswith("[Observation omitted") and "Cleve" in cf.messages[6]["content"]
    assert [cf.changes[i] for i in (5, 10, 13)] == ["kept"] * 3
    assert cf.policy == "mask-turns:1" and parse_policy("mask-turns:4").name == "mask-turns:4"
    with pytest.raises(ValueError):
        mask_turns(-1)


def first_sentence(query, doc):
    return split_sentences(doc)[0]


def test_refine_rounds_refines_every_observation_with_its_own_query():
    seen = []

    def refiner(query, doc):
        seen.append((query, doc))
        return first_sentence(query, doc)

    cf = refine_rounds(refiner)(MSGS)
    assert [q for q, _ in seen] == ["holmium", "https://h.org Two.", "Cleve", "Holmia", "Stockholm",
                                    "https://x.org Four at once.", "1879", "https://y.org Once more."]
    assert [d for _, d in seen] == [MSGS[i]["content"] for i in OBS]
    assert cf.indices("refined") == [3, 6, 8, 9, 11]  # one-sentence errors come back unchanged: kept
    assert cf.messages[3]["content"] == "Holmium is a metal."
    assert cf.details["refined"]["6"] == {"query": "Cleve", "extractive": True,
                                          "sentences": ["Cleve was Swedish.", "He was a chemist."], "kept": [0]}
    latest = refine_latest(first_sentence)(MSGS)
    assert latest.indices("refined") == [] and latest.policy == "refine-latest"  # message 13 is one sentence
    assert refine_latest(first_sentence)(MSGS[:12]).indices("refined") == [8, 9, 11]


def test_extractive_selection_and_compose_keeps_details_on_original_indices():
    assert extractive_selection("A one. B two. C three.", "C three.\nA one.") == {
        "extractive": True, "sentences": ["A one.", "B two.", "C three."], "kept": [0, 2]}
    assert extractive_selection("A one. B two.", "A summary.") == {"extractive": False}
    from attnprobe.agents.policies import make_policy

    cf = compose(make_policy("drop3", lambda m: {3: ("removed", None)}), refine_rounds(first_sentence))(MSGS)
    assert cf.changes[3] == "removed" and set(cf.details["refined"]) == {"6", "8", "9", "11"}
    assert cf.details["refined"]["6"]["kept"] == [0]
    assert refine_rounds(lambda q, d: d, name="noop")(MSGS).details == {}  # changes nothing


@pytest.mark.parametrize("spec, message", [
    ("refine:bm25:abc", "--policy 'refine:bm25:abc': N must be an integer"),
    ("mask:x", "--policy 'mask:x': K must be an integer"),
    ("mask-turns:", "--policy 'mask-turns:': K must be an integer"),
    ("mask:-2", "--policy 'mask:-2': K must be >= 0"),
    ("refine:bm25:0", "--policy 'refine:bm25:0': N must be >= 1"),
    ("ircot:z", "--policy 'ircot:z': the IRCoT variant must be one of o, oq, oqp"),
    ("refine:foo", "--policy 'refine:foo': unknown refiner 'foo'"),
    ("refine-latest:openai:gpt", "--policy 'refine-latest:openai:gpt': use refine-latest:openai:BASE_URL:MODEL"),
    ("drop", "--policy 'drop': unknown policy"),
])
def test_parse_policy_errors_name_the_value(spec, message):
    with pytest.raises(ValueError) as exc:
        parse_policy(spec)
    assert str(exc.value).startswith(message)


def test_parse_policy_refine_names():
    assert parse_policy("refine:bm25").name == "refine:bm25:3"
    assert parse_policy("refine-latest:bm25:2").name == "refine-latest:bm25:2"
    assert parse_policy("refine:bm25:1")(MSGS).indices("refined") == [3, 6, 8, 9, 11]
    assert parse_policy("refine-latest:bm25:1")(MSGS[:12]).indices("refined") == [8, 9, 11]


def test_default_min_past():
    assert default_min_past("mask:5") == 5 and default_min_past("mask-turns:3") == 5
    assert default_min_past("ircot:oq") == 1 and default_min_past(parse_policy("refine:bm25:3")) == 1
    assert default_min_past(["refine-latest:bm25", "ircot:o"]) == 1
    assert default_min_past(["mask:5", "ircot:o"]) == 1  # several families: the smallest
    assert default_min_past(compose(mask_observations(5), mask_turns(2))) == 5
    assert default_min_past(compose(mask_observations(5), refine_rounds(first_sentence))) == 1
    assert default_min_past(lambda m: None) == 5  # a user policy without a known family: the old default
    with pytest.raises(ValueError):
        default_min_past([])


# ------------------------------------------------------------------ the dropped / kept-again split
def tiny(tokens: list[str], segments: list[Segment], rows: list[list[float]]) -> CaptureResult:
    text = "".join(tokens)
    ends = np.cumsum([len(t) for t in tokens])
    offsets = np.stack([ends - [len(t) for t in tokens], ends], axis=1)
    rows = np.asarray(rows, dtype=np.float32)
    seg = np.stack([[r[s.start:s.end].sum() for s in segments] for r in rows])
    n = len(tokens)
    return CaptureResult("t", np.arange(n), segments, [QueryPoint(n - 1, "decision", 1, 3)], [0], seg,
                         seg[:, None, None, :], rows, text=text, offsets=offsets)


def test_split_of_a_refined_message_into_dropped_kept_again_and_other():
    # tokens: system | task | <tool> A1 A2. \n B1 B2. \n C1. <end> | step
    toks = ["<s>sys", "task", "<tool>", "Alpha", " one.", "\n", "Beta", " two.", "\n", "Gamma.", "<end>", "go"]
    segs = [Segment("system", "external", 0, 0, 0, 1), Segment("task", "external", 0, 1, 1, 2),
            Segment("template", "external", 0, 2, 2, 3), Segment("observation", "external", 0, 2, 3, 10),
            Segment("template", "external", 0, 2, 10, 11), Segment("reasoning", "self", 1, 3, 11, 12)]
    row = [0.1, 0.05, 0.02, 0.1, 0.1, 0.01, 0.2, 0.05, 0.01, 0.3, 0.01, 0.05]
    res = tiny(toks, segs, [row])
    info = {"2": {"extractive": True, "sentences": ["Alpha one.", "Beta two.", "Gamma."], "kept": [0, 2]}}
    out = refined_mass_split(res, info, 0)
    # Message 2 owns tokens 2-10 (seed-002 convention: <tool> opens it, the end marker <end> closes it),
    # 0.8 in all. Kept again: "Alpha one." (0.2) + "Gamma." (0.3); dropped: "Beta two." (0.25); other:
    # <tool>, two newlines, <end> (0.02 + 0.01 + 0.01 + 0.01).
    assert out["kept_again"] == pytest.approx(0.5) and out["dropped"] == pytest.approx(0.25)
    assert out["other"] == pytest.approx(0.05) and out["split_messages"] == 1 and out["unsplit"] == {}
    info["2"] = {"extractive": False}
    assert refined_mass_split(res, info, 0)["unsplit"] == {
        "2": "not extractive (the refined text is not a selection of the original sentences)"}
    bad = {"2": {"extractive": True, "sentences": ["Alpha one.", "Delta."], "kept": [0]}}
    assert refined_mass_split(res, bad, 0)["unsplit"]["2"].startswith("sentences not found")


def test_split_helpers():
    assert sentence_spans("xx A. B. A.", ["A.", "A."], 0) == [(3, 5), (9, 11)]
    assert sentence_spans("A. B.", ["C."]) is None
    offsets = np.array([[0, 2], [2, 4], [4, 6]])
    assert token_sentences(offsets, np.arange(3), [(0, 3), (3, 6)]).tolist() == [0, 0, 1]  # a tie: the earlier
    assert token_sentences(offsets, np.arange(3), [(0, 1), (3, 6)]).tolist() == [0, 1, 1]
    assert token_sentences(offsets, np.arange(3), [(0, 1)]).tolist() == [0, -1, -1]
    assert split_mass(np.array([0.2, 0.3, 0.5]), np.array([0, 1, -1]), [1]) == {
        "dropped": pytest.approx(0.2), "kept_again": pytest.approx(0.3), "other": pytest.approx(0.5)}
