"""Issue 26 item 3: tag text labelled, never re-rendered.

The IRCoT loop records what it sends as annotated tag text (documents are observations, queries tool calls);
``import --format tags`` keeps the agent's text byte for byte and annotates exact spans; counterfactual
policies act on the rounds the tag text holds and give tag text back. Tokenizer: a byte-level one with a
ChatML template (tests/support/tiny_tokenizer.py), no model.
"""

from __future__ import annotations

import json

import pytest
from support.complexity import assert_linear
from support.fixed_search import FixedSearch
from support.ircot import D1, D2, R1, R2, R3, Q, U
from support.scripted_chat import ScriptedChat
from support.tiny_tokenizer import tiny_tokenizer

from attnprobe.agents.policies import make_policy, parse_policy, refine_rounds
from attnprobe.agents.tagtext import agent_view, apply_policy, as_tags, is_tag_text, tag_rounds, unlabelled
from attnprobe.counterfactual.steps import choose_steps
from attnprobe.errors import TrajectoryError
from attnprobe.render.rendering import render
from attnprobe.studies.loop.agents import LoopConfig, run_question
from attnprobe.studies.loop.context import parse_setting
from attnprobe.studies.loop.scoring import Scorer
from attnprobe.trajectory.importers import iter_import
from attnprobe.trajectory.schema import Trajectory
from attnprobe.trajectory.tags import TagSpan, removed, scan


def script(messages, tools):
    last = messages[-1]["content"]
    return R1 if last.startswith("Answer the given question") else R3 if "Gamma" in last else R2


def run(spec="none"):
    chat = ScriptedChat(script)
    result, calls, history = run_question(chat, FixedSearch(), parse_setting(spec), LoopConfig("ircot", ircot_form="chat"), Q,
                                          run_id=f"run/{spec}", scorer=Scorer())
    return chat, calls, history


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


def seg_texts(r, trajectory_messages=None):
    """(message index, role, author, text) of every non-template segment of a rendering."""
    out = []
    for s in r.segments:
        if s.role == "template":
            continue
        a, b = int(r.offsets[s.start][0]), int(r.offsets[s.end - 1][1])
        out.append((s.message_index, s.role, s.author, r.text[a:b]))
    return out


def A(text, anns=()):
    m = {"role": "assistant", "content": text}
    if anns:
        m["annotations"] = list(anns)
    return m


def search_ann(text, query_span):
    s = text.index(query_span)
    return {"start": s, "end": s + len(query_span), "role": "tool_call", "author": "self"}


def info(docs):
    t = f"<information>{docs}</information>"
    return {"role": "user", "content": t, "annotations": [{"start": 0, "end": len(t), "role": "observation",
                                                          "author": "external"}]}


# ------------------------------------------------------------------ the loop's recorded calls
def test_recorded_ircot_call_has_observation_and_tool_call_segments(tok):
    chat, calls, history = run("none")
    # the model is sent the text only
    assert chat.sent[2] == unlabelled(calls[2]["messages"][:-1])
    assert "annotations" not in json.dumps(chat.sent)
    assert calls[2]["messages"] == [U, A(R1, [search_ann(R1, "<search>q1 first</search>")]), info(D1),
                                    A(R2, [search_ann(R2, "<search>q2 second</search>")]), info(D2), A(R3)]
    assert calls[1]["messages"][-1] == A(R2, [search_ann(R2, "<search>q2 second</search>")])  # the reply too
    r = render(Trajectory.from_dict(calls[2]), tok)
    segs = seg_texts(r)
    assert (2, "observation", "external", f"<information>{D1}</information>") in segs
    assert (4, "observation", "external", f"<information>{D2}</information>") in segs
    assert (1, "tool_call", "self", "<search>q1 first</search>") in segs
    assert (3, "tool_call", "self", "<search>q2 second</search>") in segs
    assert (1, "reasoning", "self", "<think>p0</think>") in segs
    assert (5, "reasoning", "self", R3) in segs
    assert not any(role == "task" and mi > 0 for mi, role, _, _ in segs)  # no document counts as task text
    # a reply that opens with <search> is an action step, not a reasoning start (seed 002's kinds)
    r2 = render(Trajectory.from_dict({**calls[0], "messages": [U, A("<search>q1</search>", [
        {"start": 0, "end": 19, "role": "tool_call", "author": "self"}])]}), tok)
    assert [q.kind for q in r2.queries_reasoning] == ["action"]


def test_recorded_calls_reimport_identically(tmp_path):
    """A recorded call read back by ``import --format tags`` (messages form) is the same messages, text and
    annotations, as the loop wrote: one labelling for both."""
    for spec in ("none", "ircot:o", "ircot:oq"):
        _, calls, _ = run(spec)
        p = tmp_path / f"{spec.replace(':', '_')}.jsonl"
        p.write_text("\n".join(json.dumps({"id": c["id"], "messages": c["messages"]}) for c in calls) + "\n")
        for c, t in zip(calls, iter_import(p, "tags")):
            assert t.messages == c["messages"], spec


def test_history_counterfactuals_run_on_the_tag_text():
    _, calls, history = run("none")
    traj = Trajectory.from_dict(history)
    assert [m.get("tag_text") for m in traj.messages if m["role"] == "assistant"] == [R1, R2, None]
    view = agent_view(traj)
    assert view.messages == calls[2]["messages"]  # exactly what the last call saw, plus its reply
    steps = choose_steps(traj, min_past=1)
    assert [(s.message_index, s.turn) for s in steps] == [(3, 1), (5, 2)]
    assert steps[0].trajectory.messages == view.messages


# ------------------------------------------------------------------ the importer
SR1 = ("<think>who?</think>\n<search> Astrid Cleve </search>\n\n<information>Doc 1(Title: A) x <search>in doc"
       "</information>\n\n<think>son</think><search>Ulf</search>\n\n<information>Doc 1(Title: U) 1970</information>"
       "\n\n<think>done</think><answer> 1970 </answer>")


def _write(path, records):
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    return path


def test_import_keeps_the_text_byte_identical_and_annotates_exact_spans(tmp_path):
    text = SR1.replace("who?", "wh\u00f6? \u2014 \U0001F600")  # non-ASCII: offsets are characters
    p = _write(tmp_path / "sr1.jsonl", [{"id": "a", "prompt": "Question: who?", "response": text}])
    (t,) = iter_import(p, "tags")
    assert t.messages[1]["content"] == text
    out = tmp_path / "out.jsonl"
    from attnprobe.trajectory.schema import load_trajectories, save_trajectories

    save_trajectories([t], out)
    (back,) = load_trajectories(out)
    assert back.messages[1]["content"].encode("utf-8") == text.encode("utf-8")
    got = [(a["start"], a["end"], a["role"], a["author"]) for a in back.messages[1]["annotations"]]
    s1 = text.index("<search> Astrid")
    i1 = text.index("<information>Doc 1(Title: A)")
    s2 = text.index("<search>Ulf")
    i2 = text.index("<information>Doc 1(Title: U)")
    assert got == [(s1, s1 + 31, "tool_call", "self"),
                   (i1, text.index("</information>") + 14, "observation", "external"),  # "<search>" inside: doc text
                   (s2, s2 + 20, "tool_call", "self"),
                   (i2, i2 + len("<information>Doc 1(Title: U) 1970</information>"), "observation", "external")]
    assert text[s1:s1 + 31] == "<search> Astrid Cleve </search>"


def test_import_messages_form_reads_tags_only_after_the_first_turn(tmp_path):
    msgs = [U, A(R1), {"role": "user", "content": f"\n\n<information>{D1}</information>\n\n"},
            A("no tags </search>"), {"role": "user", "content": "My previous action is invalid. put the query "
                                     "between <search> and </search>."}, A(R3)]
    (t,) = iter_import(_write(tmp_path / "m.jsonl", [{"messages": msgs}]), "tags")
    assert [m["content"] for m in t.messages] == [m["content"] for m in msgs]
    assert "annotations" not in t.messages[0]  # the instructions name the tags; they are the task
    assert t.messages[2]["annotations"] == [{"start": 2, "end": 2 + 27 + len(D1), "role": "observation",
                                             "author": "external"}]
    assert "annotations" not in t.messages[3] and "annotations" not in t.messages[4]  # stray closing tag; feedback


@pytest.mark.parametrize("record, field, needle", [
    ({"response": "<search>a</search><information>d</information><information>e</information>"}, "response",
     "the <information> block at character 46 answers no <search>"),
    ({"response": "<think>x</think><information>d</information>"}, "response",
     "the <information> block at character 16 answers no <search>"),
    ({"response": "<search>a</search><information>docs <answer>1970</answer>"}, "response",
     "unclosed <information> at character 18: it would swallow the rest of the text, including the <answer> at "
     "character 36"),
    ({"response": "<search>cut off <information>d</information>"}, "response",
     "unclosed <search> at character 0, followed by the <information> block at character 16"),
    ({"messages": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "<think>t</think>"},
                   {"role": "user", "content": "<information>d</information>"}]}, "messages[2].content",
     "answers no <search>"),
    # issue 27: an import refuses what the loop reads leniently (a nested <search>, an empty query)
    ({"prompt": "Q", "response": "<search>a <search>b</search><information>d</information>"}, "response",
     "a <search> at character 10 inside the query opened at character 0 (nested <search>)"),
    ({"messages": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "<t>x</t><search> </search>"},
                   {"role": "user", "content": "invalid"}]}, "messages[1].content",
     "the <search> at character 8 has an empty query"),
])
def test_malformed_tag_logs_are_one_located_error(tmp_path, record, field, needle):
    p = _write(tmp_path / "bad.jsonl", [{"id": "ok", "response": "<answer>1</answer>"}, {"id": "b", **record}])
    with pytest.raises(TrajectoryError) as exc:
        list(iter_import(p, "tags"))
    msg = str(exc.value)
    assert msg.startswith(f"{p}, line 2, field '{field}': ") and needle in msg and "\n" not in msg


def test_documented_acceptances(tmp_path):
    """The scanner (the loop's reading) keeps a nested <search> as query text (Search-R1's first-close reading)
    and an empty query as a labelled span but no round (parse_tags ignores it); an import refuses both (above).
    An unclosed <search> with nothing after it is prose, in both."""
    text = "<search>a <search>b</search><information>d</information>"
    assert scan(text)[0][0] == TagSpan("search", 0, 28)
    e = [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "<search> </search>",
                                             "annotations": [{"start": 0, "end": 18, "role": "tool_call",
                                                              "author": "self"}]}]
    assert scan(e[1]["content"])[0] == [TagSpan("search", 0, 18)]
    assert "tool_calls" not in tag_rounds(e)[1]
    (u,) = iter_import(_write(tmp_path / "ok.jsonl", [{"id": "u", "prompt": "Q",
                                                       "response": "<think>t</think><search>cut off"}]), "tags")
    assert "annotations" not in u.messages[1]


TAG_TEXTS = {  # the response of one record, about n characters of each hostile kind
    "unclosed documents": lambda n: "<search>q</search><information>" + "x" * n,
    "unclosed query": lambda n: "<search>" + "y" * n,
    "open tags": lambda n: "<search>" * (n // 8),  # the old regex: 8.8 s at 64 KB, quadratic
    "many queries, a late block": lambda n: "<search>q</search>" * (n // 18) + "<information>",
    "tags inside documents": lambda n: "<search>q</search><information>" + "<search>" * (n // 8) + "</information>",
}


@pytest.mark.parametrize("kind", TAG_TEXTS)
def test_parsing_is_linear_time(tmp_path, kind):
    """How the import's cost grows from 62.5 KB to 1 MB (CPU time ratio, support/complexity.py), not a time
    limit (issue 38); a backtracking regex takes minutes at 1 MB."""
    def make(n):
        return (_write(tmp_path / f"big{n}.jsonl", [{"id": "big", "prompt": "Q", "response": TAG_TEXTS[kind](n)}]),)

    def parse(path):
        try:
            return list(iter_import(path, "tags"))
        except TrajectoryError:
            return None

    assert_linear(parse, make, 62_500, 1_000_000)


# ------------------------------------------------------------------ counterfactuals on tag text
def _imported(tmp_path):
    msgs = [U, A(R1), {"role": "user", "content": f"<information>{D1}</information>"}, A(R2),
            {"role": "user", "content": f"<information>{D2}</information>"}, A(R3)]
    (t,) = iter_import(_write(tmp_path / "log.jsonl", [{"id": "x", "messages": msgs}]), "tags")
    return t


def test_rounds_round_trip_is_exact(tmp_path):
    t = _imported(tmp_path)
    assert is_tag_text(t.messages)
    rounds = tag_rounds(t.messages)
    assert [m["role"] for m in rounds] == ["user", "assistant", "tool", "assistant", "tool", "assistant"]
    assert rounds[1]["content"] == "<think>p0</think>" and rounds[2]["content"] == D1
    assert json.loads(rounds[1]["tool_calls"][0]["function"]["arguments"]) == {"query": "q1 first"}
    assert as_tags(rounds) == (t.messages, list(range(6)))
    same = apply_policy(make_policy("none", lambda m: {}), t.messages)
    assert same.messages == t.messages and not same.changed


def test_counterfactual_ircot_o_on_imported_tags(tmp_path, tok):
    t = _imported(tmp_path)
    cf = apply_policy(parse_policy("ircot:o"), t.messages[:5])
    assert cf.messages == [U, A(R1, [search_ann(R1, "<search>q1 first</search>")]),
                           A(R2, [search_ann(R2, "<search>q2 second</search>")]), info(D2)]
    assert cf.source == [0, 1, 3, 4] and cf.indices("removed") == [2]
    Trajectory.from_dict({"id": "cf", "messages": cf.messages + [t.messages[5]]})  # annotations valid
    segs = seg_texts(render(Trajectory(id="cf", messages=cf.messages + [t.messages[5]]), tok))
    assert [s for s in segs if s[1] == "observation"] == [(3, "observation", "external", f"<information>{D2}</information>")]
    assert [s[3] for s in segs if s[1] == "tool_call"] == ["<search>q1 first</search>", "<search>q2 second</search>"]
    oq = apply_policy(parse_policy("ircot:oq"), t.messages[:5])
    assert oq.messages[1] == A("<think>p0</think>") and oq.changes[1] == "calls_removed" and oq.source == [0, 1, 3, 4]


def test_counterfactual_refiner_sees_query_and_documents(tmp_path):
    t = _imported(tmp_path)
    seen = []

    def refiner(q, d):
        seen.append((q, d))
        return f"R[{q}]"

    cf = apply_policy(refine_rounds(refiner, name="refine:t"), t.messages[:5])
    assert seen == [("q1 first", D1), ("q2 second", D2)]
    assert cf.messages[2] == info("R[q1 first]") and cf.changes == {0: "kept", 1: "kept", 2: "refined", 3: "kept",
                                                                     4: "refined"}


def test_study_attention_shares_of_a_tag_text_call_show_o_q_p(tok):
    """``study attention``'s categories on a recorded IRCoT call (uniform attention over its tokens, byte-level
    tokens, ChatML): documents are past observations, queries past tool calls, thoughts past reasoning, each
    with its message's markers (seed 002 convention); only the instructions are task."""
    import numpy as np

    from attnprobe.results.result import CaptureResult
    from attnprobe.studies.loop.attention import call_shares

    _, calls, _ = run("none")
    r = render(Trajectory.from_dict(calls[2]), tok)
    n = len(r.input_ids)
    reply = [q for q in r.queries_reasoning if q.message_index == 5]
    rows = np.full((2, n), 1.0 / n)
    res = CaptureResult("t", r.input_ids, r.segments, [reply[0], r.decision], [0], np.zeros((2, len(r.segments))),
                        np.zeros((2, 1, 1, len(r.segments))), rows,
                        meta={"trajectory_meta": calls[2]["meta"]}, text=r.text, offsets=r.offsets)

    def tokens(role, content):  # <|im_start|> role \n content <|im_end|> \n, one token per byte
        return 1 + len(f"{role}\n".encode()) + len(content.encode()) + 2

    # each turn ends with its query, so its closing <|im_end|> \n (2 tokens) goes with the query
    q = len("<search>q1 first</search>") + len("<search>q2 second</search>") + 2 * 2
    want = {"system": 1, "task": tokens("user", U["content"]) - 1,
            "past_reasoning": tokens("assistant", R1) + tokens("assistant", R2) - q, "past_tool_call": q,
            "past_observation": tokens("user", f"<information>{D1}</information>")
            + tokens("user", f"<information>{D2}</information>"),
            "placeholder": 0, "refined": 0, "current_step": tokens("assistant", R3)}
    assert sum(want.values()) == n
    for name in ("reasoning", "decision"):
        assert call_shares(res)[name] == pytest.approx({k: v / n for k, v in want.items()}, abs=1e-12)


@pytest.mark.slow  # ~10 s on 2 shared cores (torch, a capture and 3 renders per step); CI runs it
def test_counterfactual_run_on_an_ircot_history_edits_the_tag_text(tmp_path, tok):
    """``attnprobe counterfactual`` end to end on a loop history (a 2-layer random Llama, byte-level tokens):
    the steps are the tag text's, ircot:o at the last step removes exactly the first ``<information>`` message
    (its tokens are the tokens saved) and nothing at the step before."""
    import torch
    from support.cfrun import run_counterfactuals
    from transformers import AutoModelForCausalLM, LlamaConfig

    from attnprobe_hooks.backend import LoadedModel

    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=4096)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg).eval()
    loaded = LoadedModel(model=model, tokenizer=tok, spec="tiny-llama", name="tiny-llama", backend="transformers",
                         dtype="float32", source="hf-folder", attn_implementation="eager")
    _, _, history = run("none")
    counts = run_counterfactuals(loaded, [Trajectory.from_dict(history)], [parse_policy("ircot:o")], tmp_path,
                                 min_past=1)
    assert counts["done"] == 2 and counts["failed"] == 0
    recs = {int(p.parent.name.split("_")[1]): json.loads(p.read_text()) for p in tmp_path.rglob("record.json")}
    assert sorted(recs) == [3, 5]
    assert recs[3]["changed"] is False
    r = recs[5]
    assert r["changes"] == {"0": "kept", "1": "kept", "2": "removed", "3": "kept", "4": "kept"}
    assert r["source"] == [0, 1, 3, 4]
    assert r["tokens"]["saved"] == 1 + len("user\n") + len(f"<information>{D1}</information>") + 2
    for q in ("decision", "reasoning"):
        assert r["queries"][q]["removed_mass"] == pytest.approx(r["queries"][q]["removed_observation_mass"], abs=1e-6)
        assert r["queries"][q]["removed_mass"] > 0


@pytest.mark.parametrize("text", [
    "", "no tags", "a <search>q</search> b", "a <search>q</search> b <search>r</search>c",
    "think <search>open to the end", "think <search>open\n", "x <search>a</search> y <search>open\nmore\n",
    "</search> stray close <search>q</search>", "<search><search>q</search></search> tail", "<search>\n",
])
def test_removed_equals_the_lazy_regex_it_replaces(text):
    import re

    assert removed(text, "search") == re.sub(r"<search>.*?(?:</search>|$)", "", text, flags=re.S)


def test_removed_is_linear_on_unclosed_tags():
    assert_linear(lambda t: removed(t, "search"), lambda n: ("<search> x " * (n // 11),), 62_500, 1_000_000)
