"""Issue 19 items 1, 2, 9 and issue 26 items 5, 9: masking as seed 002's released scaffold does it
(mask:K, turns) and by observations (mask-obs:K) with parallel calls and errors, the release's placeholder,
refiners per round, the refined message's dropped / kept-again split, policy parser errors and the
default --min-past per policy family. Hand-built inputs with known answers."""

from __future__ import annotations

import numpy as np
import pytest
from support.messages import call

from attnprobe.agents.masking import archive_args, archive_is_error
from attnprobe.agents.policies import (
    compose,
    default_min_past,
    extractive_selection,
    mask_archive,
    mask_observations,
    min_past_of,
    parse_policy,
    policy_rule,
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


def test_mask_obs_counts_observations_errors_exempt_and_free():
    # Non-error observations 3, 6, 8, 9, 11: the two most recent (9, 11) stay, even though the newest
    # turn (message 7) made four parallel calls: mask-obs:K counts tool messages, so 8 is masked.
    assert masked(mask_observations(2)(MSGS)) == [3, 6, 8]
    # Errors 5, 10, 13 never masked and use no slot: mask-obs:3 keeps 8, 9, 11 (not 10, 11, 13).
    assert masked(mask_observations(3)(MSGS)) == [3, 6]
    assert masked(mask_observations(0)(MSGS)) == [3, 6, 8, 9, 11]
    # Without the exemption errors are ordinary observations.
    assert masked(mask_observations(2, keep_errors=False)(MSGS)) == [3, 5, 6, 8, 9, 10]
    assert mask_observations(2)(MSGS).policy == "mask-obs:2" and parse_policy("mask-obs:4").name == "mask-obs:4"
    assert mask_observations(1)(MSGS).messages[6]["content"] == (
        '[Observation omitted to save context. Tool: web_search; arguments: {"query": "Cleve"}]')


def ph(name, args):
    return f"[Auto-archived browser result] tool={name} | args: {args}"


def test_mask_is_the_released_rule_turns_with_a_non_error_call_errors_never_archived():
    # Turns with a non-error call: 2 (c0), 4 (c2 succeeds beside the error c1), 7 (four parallel calls, c5
    # fails); 12 made only a failing call, so it is no turn. The K-th most recent counted turn is the cutoff:
    # every successful result before it is archived, whatever turn it answers; errors 5, 10, 13 never.
    assert mask_archive(0)(MSGS).changed is False  # K <= 0 archives nothing, as in the release
    one = mask_archive(1)(MSGS)  # cutoff: message 7, so all four of its parallel results stay
    assert masked(one) == [3, 6] and [one.changes[i] for i in (5, 8, 9, 10, 11, 13)] == ["kept"] * 6
    assert one.messages[3]["content"] == ph("web_search", "query='holmium'")
    assert one.messages[6]["content"] == ph("web_search", "query='Cleve'")
    assert one.messages[5]["content"] == ERR and one.messages[6]["tool_call_id"] == "c2"
    two = mask_archive(2)(MSGS)  # cutoff: message 4; only 3 is before it
    assert masked(two) == [3] and two.messages[3]["content"] == ph("web_search", "query='holmium'")
    assert masked(mask_archive(3)(MSGS)) == [] and masked(mask_archive(4)(MSGS)) == []
    assert one.policy == "mask:1" and parse_policy("mask:2").name == "mask:2"
    # only the archivable tools: visit_page results are neither archived nor count a turn
    assert masked(mask_archive(1, tools=["web_search"])(MSGS)) == [3, 6]
    with pytest.raises(ValueError):
        mask_archive(-1)


def test_mask_leaves_an_archived_result_and_a_result_without_its_call_alone():
    done = ph("web_search", "query='holmium'")
    msgs = [*MSGS[:3], {**MSGS[3], "content": done}, *MSGS[4:]]
    cf = mask_archive(1)(msgs)  # message 3 already holds a placeholder (the release's _is_archived)
    assert masked(cf) == [6] and cf.messages[3]["content"] == done
    # a result whose call is not in the prefix has no tool name: left as it is
    assert masked(mask_archive(1)([{"role": "tool", "tool_call_id": "zz", "content": "x"}] + MSGS[2:])) == [2, 5]  # not 0
    # the newest turn's only call succeeds now: turn 12 counts, so 8, 9, 11 are archived too
    ok = [*MSGS[:13], {**MSGS[13], "content": "Page y."}]
    assert masked(mask_archive(1)(ok)) == [3, 6, 8, 9, 11]


def test_archive_args_is_the_releases_args_desc():
    assert archive_args('{"query": "holmium", "topn": 10}') == "query='holmium', topn=10"
    assert archive_args({"id": 3, "loc": 0}) == "id=3, loc=0"
    long = "x" * 100
    assert archive_args({"query": long}) == "query=" + ("'" + long)[:80]  # repr(v)[:80]: the quote counts
    assert archive_args("not json") == "raw='not json'"
    assert archive_args("{}") == "no args" and archive_args("[1, 2]") == "no args" and archive_args(None) == "no args"
    assert archive_args({"q": "Ångström"}) == "q='Ångström'"


@pytest.mark.parametrize("text, error", [
    ("Error executing browser.search: timeout", True), ("Error rendering browser.open result: x", True),
    ("Error: Invalid arguments for function 'open'", True),
    ("An unexpected error occurred while executing function browser.find", True),
    ('{"error": "rate limited"}', True), ('{"error": broken', False), ("Holmium is a metal.", False),
    ("No results for 'x'.", False),
])
def test_archive_is_error_knows_the_releases_error_texts(text, error):
    assert archive_is_error({"role": "tool", "content": text}) is error


def test_mask_turns_is_refused_with_its_replacement():
    with pytest.raises(ValueError, match="mask-turns:K was removed; mask:K now counts turns"):
        parse_policy("mask-turns:2")


def test_policy_rule_names_the_rule_and_placeholder():
    assert policy_rule("mask:5")["placeholder"] == "[Auto-archived browser result] tool=<name> | args: <k=repr(v)[:80], ...>"
    assert "tools/context_management.py" in policy_rule("mask:5")["rule"]
    assert policy_rule("mask-obs:2")["placeholder"].startswith("[Observation omitted")
    assert policy_rule("ircot:o") is None and policy_rule("none") is None


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
    ("refine:bm25:abc", "policy 'refine:bm25:abc': N must be an integer"),
    ("mask:x", "policy 'mask:x': K must be an integer"),
    ("mask-obs:", "policy 'mask-obs:': K must be an integer"),
    ("mask:-2", "policy 'mask:-2': K must be >= 0"),
    ("refine:bm25:0", "policy 'refine:bm25:0': N must be >= 1"),
    ("ircot:z", "policy 'ircot:z': the IRCoT variant must be one of o, oq, oqp"),
    ("refine:foo", "policy 'refine:foo': unknown refiner 'foo'"),
    ("refine-latest:openai:gpt", "policy 'refine-latest:openai:gpt': use refine-latest:openai:BASE_URL:MODEL"),
    ("drop", "policy 'drop': unknown policy"),
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
    # masking: K + 1, the first step at which it can act (mask:1 archives at 2 past turns; issue 26 item 9)
    assert [min_past_of(f"mask:{k}") for k in (0, 1, 2, 5)] == [1, 2, 3, 6]
    assert [min_past_of(f"mask-obs:{k}") for k in (0, 1, 5)] == [1, 2, 6]
    assert default_min_past("mask:5") == 6 and default_min_past("mask-obs:3") == 4
    assert default_min_past("ircot:oq") == 2 and default_min_past(parse_policy("refine:bm25:3")) == 1
    assert default_min_past(["refine-latest:bm25", "ircot:o"]) == 1
    assert default_min_past(["mask:5", "ircot:o"]) == 2  # several policies: the smallest
    assert default_min_past(["mask:1", "mask:4"]) == 2
    assert default_min_past(compose(mask_observations(5), mask_archive(2))) == 3
    assert default_min_past(compose(mask_observations(5), refine_rounds(first_sentence))) == 1
    assert default_min_past(lambda m: None) == 5  # a user policy without a known family: the old default
    with pytest.raises(ValueError):
        default_min_past([])


@pytest.mark.parametrize("k", [0, 1, 2, 3])
def test_mask_first_acts_at_k_plus_one_past_turns(k):
    """One search per turn: after t turns the prefix has t results; mask:K archives at t = K + 1 first."""
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}]
    first = None
    for t in range(1, 7):
        msgs += [{"role": "assistant", "content": f"t{t}", "tool_calls": [call(f"c{t}", "search", query=f"q{t}")]},
                 {"role": "tool", "tool_call_id": f"c{t}", "content": f"result {t}"}]
        if first is None and mask_archive(k)(msgs).changed:
            first = t
    assert first == (None if k == 0 else k + 1)
    if k:
        assert first == min_past_of(f"mask:{k}")


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
