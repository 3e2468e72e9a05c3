"""Qwen formats in process (issue 37 item 2), against seed 002's release (i-DeepSearch/observation-masking) and
the real Qwen2.5, Qwen3 and Qwen3.5 chat templates (tests/data/chat_templates/, set on the bundled SmolLM2
tokenizer, which shares Qwen's ChatML markers): XML tool calls, <think> split into reasoning_content, the
content of tool-call turns emptied, the parallel-call sentence per template family, and on each template the
rendering, segmentation, decision token, reasoning start and the masking of parallel calls."""

from __future__ import annotations

import json

import pytest
from support.chat_templates import qwen_tokenizers
from support.fixed_search import FixedSearch
from support.ircot import R1, R2, R3
from support.ircot import Q as IRCOT_Q
from support.scripted_chat import ParsingChat, ScriptedChat

from attnprobe.agents.tools import tool_lines
from attnprobe.errors import RenderError
from attnprobe.generation.toolparse import ParsedCall, native_turn, parse_tool_calls, split_think
from attnprobe.render.rendering import render
from attnprobe.studies.loop.agents import LoopConfig, run_question
from attnprobe.studies.loop.context import parse_setting
from attnprobe.studies.loop.pool import TOOLS
from attnprobe.studies.loop.prompts import SEED002_SYSTEM, seed002_system, template_family
from attnprobe.studies.loop.scoring import Scorer
from attnprobe.trajectory.schema import Trajectory

NAMES = ["search", "open", "find"]


def xml(name: str, **args) -> str:
    """A call as Qwen3.5's template writes one (and the model is told to)."""
    params = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in args.items())
    return f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"


def js(name: str, **args) -> str:
    """A call as Qwen2.5's and Qwen3's templates write one."""
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}) + "\n</tool_call>"


# ------------------------------------------------------------------ the parser (utils/tool_parsers.py)
def test_a_reply_with_two_function_calls_parses_to_two_calls():
    text = "I need two searches.\n</think>\n\n" + xml("search", query="q1 a") + "\n" + xml("search", query="q2 b")
    head, calls = parse_tool_calls(text, NAMES)
    assert calls == [ParsedCall("search", {"query": "q1 a"}), ParsedCall("search", {"query": "q2 b"})]
    assert head == "I need two searches.\n</think>"
    # one <tool_call> block holding two <function=...> blocks is two calls too ("one or more <function=...>")
    one = ("<tool_call>\n<function=open>\n<parameter=id>\n2\n</parameter>\n</function>\n<function=find>\n"
           '<parameter=id>\n"2"\n</parameter>\n<parameter=pattern>\nAnswer is\n</parameter>\n</function>\n</tool_call>')
    assert parse_tool_calls(one, NAMES)[1] == [ParsedCall("open", {"id": 2}),
                                               ParsedCall("find", {"id": 2, "pattern": "Answer is"})]


def test_parameter_values_as_the_release_decodes_them():
    text = ("<tool_call>\n<function=search>\n<parameter=query>\nline one\nline two\n</parameter>\n"
            '<parameter=k>\n["a", "b"]\n</parameter>\n<parameter=flag>\ntrue\n</parameter>\n'
            "<parameter=n>\n007\n</parameter>\n<parameter=cut>\nnever closed\n</function>\n</tool_call>")
    # strip, one pair of quotes dropped, JSON when it parses, digits as an int, else the text; an unclosed
    # parameter is dropped (the release's regex needs its </parameter>)
    assert parse_tool_calls(text, NAMES)[1] == [ParsedCall("search", {"query": "line one\nline two", "k": ["a", "b"],
                                                                       "flag": True, "n": 7})]
    # an unclosed </function> runs to the end; an unknown tool is no call; JSON in <tool_call> is read first
    assert parse_tool_calls("<tool_call>\n<function=find>\n<parameter=id>\n1\n</parameter>", NAMES)[1] == [
        ParsedCall("find", {"id": 1})]
    assert parse_tool_calls(xml("shell", cmd="ls"), NAMES)[1] == []
    assert parse_tool_calls(js("open", id="2"), NAMES)[1] == [ParsedCall("open", {"id": "2"})]


@pytest.mark.parametrize("text,reasoning,has_calls,expected", [
    ("<think>\nplan\n</think>\n\nExact Answer: 42", None, False, ("Exact Answer: 42", "plan")),
    ("plan\n</think>\n\n" + xml("search", query="q"), None, True, ("", "plan")),  # <think> opened by the template
    ("Let me search. " + js("search", query="q"), None, True, ("", None)),  # a tool-call turn keeps no content
    ("no tags", None, False, ("no tags", None)),
    ("<think>a</think>b", "from the server", False, ("b", "from the server")),  # an endpoint's reasoning_content
    # the reasoning is read before <tool_response>, the content after </think> as written (the release's quirk)
    ("<think>a</think> b <tool_response>x</tool_response>", None, False, ("b <tool_response>x</tool_response>", "a")),
])
def test_native_turn_is_the_releases(text, reasoning, has_calls, expected):
    assert native_turn(text, reasoning, has_calls) == expected


def test_split_think():
    assert split_think("<think> a </think> b <think>c</think>") == ("a", "b <think>c</think>")
    assert split_think("a</think>b</think>") == ("a", "b</think>")
    assert split_think("x <tool_response>y</think>") == (None, "x ")


# ------------------------------------------------------------------ the real templates
@pytest.fixture(scope="module")
def qwen(bundled_folder):
    from transformers import AutoTokenizer

    return qwen_tokenizers(AutoTokenizer.from_pretrained(bundled_folder))


QWEN_SENTENCE = ("When several function calls are independent, you may issue parallel tool calls by outputting "
                 "multiple consecutive `<tool_call>...</tool_call>` blocks in the same assistant turn, one function "
                 "call per block.")
JSON_SENTENCE = ("When several function calls are independent, issue them in parallel by outputting multiple "
                 "consecutive <tool_call>...</tool_call> blocks in the same response, one function call per block.")
EXAMPLE = 'Call a tool with JSON, for example {"name": "search", "arguments": {"query": "keywords"}}.'


def test_parallel_sentence_per_template_family(qwen, bundled_folder):
    from transformers import AutoTokenizer

    assert {f: template_family(t.chat_template) for f, t in qwen.items()} == {
        "qwen2.5": "tool-call", "qwen3": "tool-call", "qwen3.5": "qwen-xml"}
    assert template_family(AutoTokenizer.from_pretrained(bundled_folder).chat_template) == "none"  # SmolLM2
    assert template_family(qwen["qwen3.5"].chat_template, "deepseek-ai/DeepSeek-V3.2") == "deepseek"  # the id first
    assert [template_family(None, m) for m in ("Qwen/Qwen3.5-27B", "Qwen/Qwen2.5-7B-Instruct", "my-model")] == [
        "qwen-xml", "tool-call", "none"]
    lines = tool_lines(TOOLS)
    assert seed002_system(TOOLS, "qwen-xml") == f"{SEED002_SYSTEM}\n\n{QWEN_SENTENCE}\n\nTools:\n{lines}"  # no JSON
    assert seed002_system(TOOLS, "tool-call") == f"{SEED002_SYSTEM}\n\n{JSON_SENTENCE}\n\nTools:\n{lines}\n{EXAMPLE}"
    assert seed002_system(TOOLS, "none") == f"{SEED002_SYSTEM}\n\nTools:\n{lines}\n{EXAMPLE}"


Q = {"id": "t1", "question": "What is the answer?", "answers": ["42"]}
FINAL = "Explanation: it says so.\nExact Answer: 42\nConfidence: 90%"
REPLIES = {  # what each family's model writes after its generation prompt (Qwen3.5's opened "<think>\n")
    "qwen3.5": ["I need two searches.\n</think>\n\n" + xml("search", query="q1 a") + "\n" + xml("search", query="q2 b"),
                "Open page 2.\n</think>\n\n" + xml("open", id=2), "Found it.\n</think>\n\n" + FINAL],
    "qwen3": ["<think>\nI need two searches.\n</think>\n\n" + js("search", query="q1 a") + "\n" + js("search", query="q2 b"),
              "<think>\nOpen page 2.\n</think>\n\n" + js("open", id=2), "<think>\nFound it.\n</think>\n\n" + FINAL],
}
REPLIES["qwen2.5"] = REPLIES["qwen3"]
A1 = "[Auto-archived browser result] tool=search | args: query='q1 a'"
A2 = "[Auto-archived browser result] tool=search | args: query='q2 b'"
OPEN2 = "[2] C (u/c)\nL0: C\nL1: Gamma one.\nL2: Answer is 42.\n(lines 0-2 of 3)"


def call(i: int, name: str, **args) -> dict:
    return {"id": f"call{i}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


def run(family: str, tokenizer):
    chat = ParsingChat(lambda m, tools: REPLIES[family][sum(x["role"] == "assistant" for x in m)], tokenizer)
    result, calls, history = run_question(chat, FixedSearch(), parse_setting("mask:1"),
                                          LoopConfig("seed002", max_turns=4, top_k=2), Q, run_id="run", scorer=Scorer())
    return chat, result, calls


@pytest.mark.parametrize("family", ["qwen2.5", "qwen3", "qwen3.5"])
def test_seed002_on_the_real_template_masks_the_parallel_calls(qwen, family):
    chat, result, calls = run(family, qwen[family])
    assert (result["answer"], result["correct"], result["tool_calls"], result["retrievals"]) == ("42", True, 3, 2)
    system = seed002_system(TOOLS, template_family(qwen[family].chat_template))
    turn1 = {"role": "assistant", "content": "", "reasoning_content": "I need two searches.",
             "tool_calls": [call(1, "search", query="q1 a"), call(2, "search", query="q2 b")]}
    turn2 = {"role": "assistant", "content": "", "reasoning_content": "Open page 2.", "tool_calls": [call(3, "open", id=2)]}
    # mask:1 at the third call: both results of the parallel turn archived with the release's placeholder
    assert chat.sent[2] == [{"role": "system", "content": system}, {"role": "user", "content": Q["question"]}, turn1,
                            {"role": "tool", "tool_call_id": "call1", "name": "search", "content": A1},
                            {"role": "tool", "tool_call_id": "call2", "name": "search", "content": A2},
                            turn2, {"role": "tool", "tool_call_id": "call3", "name": "open", "content": OPEN2}]
    assert calls[2]["messages"][-1] == {"role": "assistant", "content": FINAL, "reasoning_content": "Found it."}


# per family: the rendering that locates every part, and the text from the decision token's end to the
# reasoning start: Qwen3.5's generation prompt opens "<think>\n" (the model read it: the decision is its last
# token); Qwen3's opens no <think> and the template writes the reply's "<think>\n" (the decision is before it);
# Qwen2.5 drops reasoning_content, so the reasoning is rendered in the content (the next rendering)
EXPECTED = {"qwen3.5": ("native", ""), "qwen3": ("native", "<think>\n"),
            "qwen2.5": ("native+reasoning-in-content", "")}


@pytest.mark.parametrize("family", ["qwen2.5", "qwen3", "qwen3.5"])
def test_segments_decision_and_reasoning_start_on_the_real_template(qwen, family):
    tok = qwen[family]
    _, _, calls = run(family, tok)
    t = Trajectory.from_dict(calls[2])
    r = render(t, tok)
    rendering, gap = EXPECTED[family]
    assert r.rendering == rendering

    def text(s):
        return r.text[int(r.offsets[s.start][0]):int(r.offsets[s.end - 1][1])]

    got = [(s.message_index, s.part, s.role, s.author, s.turn, text(s)) for s in r.segments if s.role != "template"]
    call_text = {"qwen3.5": ("search>\n<parameter=query>\nq1 a", "search>\n<parameter=query>\nq2 b",
                             "open>\n<parameter=id>\n2"),
                 "qwen3": ('{"name": "search", "arguments": {"query": "q1 a"}}',
                           '{"name": "search", "arguments": {"query": "q2 b"}}', '{"name": "open", "arguments": {"id": 2}}')}
    c1, c2, c3 = call_text["qwen3" if family == "qwen2.5" else family]
    assert got[1:] == [
        (1, "content", "task", "external", 0, "What is the answer?"),
        (2, "reasoning_content", "reasoning", "self", 0, "I need two searches."),
        (2, "tool_calls[0]", "tool_call", "self", 0, c1), (2, "tool_calls[1]", "tool_call", "self", 0, c2),
        (3, "content", "observation", "external", 0, A1), (4, "content", "observation", "external", 0, A2),
        (5, "reasoning_content", "reasoning", "self", 1, "Open page 2."),
        (5, "tool_calls[0]", "tool_call", "self", 1, c3),
        (6, "content", "observation", "external", 1, OPEN2),
        (7, "reasoning_content", "reasoning", "self", 2, "Found it."),
        (7, "content", "reasoning", "self", 2, FINAL)]
    assert got[0][:5] == (0, "content", "system", "external", 0) and text(r.segments[[
        s.role for s in r.segments].index("system")]).startswith("You are a deep research agent.")
    # the two archived results of the parallel turn: one user turn, each in its own <tool_response>
    assert (f"<|im_start|>user\n<tool_response>\n{A1}\n</tool_response>\n<tool_response>\n{A2}\n</tool_response>"
            "<|im_end|>") in r.text
    # the reasoning start: the reply's first token; the decision: the last token of the prompt the model read
    start = next(q for q in r.queries_reasoning if q.message_index == 7)
    assert (start.kind, tok.convert_ids_to_tokens(int(r.input_ids[start.position]))) == ("reasoning", "Found")
    assert r.text[int(r.offsets[r.decision.position][1]):int(r.offsets[start.position][0])] == gap
    assert r.decision.position == start.position - 1 - len(tok(gap, add_special_tokens=False)["input_ids"])
    assert (r.decision.message_index, r.decision.turn) == (7, 2)
    pending = render(Trajectory(id=t.id, messages=t.messages[:-1], tools=t.tools), tok)
    assert pending.text.endswith("<|im_start|>assistant\n<think>\n" if family == "qwen3.5" else "<|im_start|>assistant\n")
    assert pending.decision.position == len(pending.input_ids) - 1 == r.decision.position
    assert list(pending.input_ids) == list(r.input_ids[:len(pending.input_ids)])
    assert r.text[:int(r.offsets[r.decision.position][1])] == pending.text


@pytest.mark.parametrize("family", ["qwen3", "qwen3.5"])
def test_ircot_tag_turns_cannot_be_rendered_by_templates_that_strip_earlier_think(qwen, family):
    """Qwen3 drops the <think> text of every assistant turn before the last user message (and the IRCoT
    scaffold sends each observation as a user message); Qwen3.5 rewrites every <think>p</think> as
    <think>\np\n</think>\n\n. So the multi-turn IRCoT form cannot be sent to these models in process:
    every part must be found, and no rendering finds the first turn as written. Qwen2.5 keeps the text
    (Search-R1's single stream, issue 37 item 1, avoids the question)."""
    chat = ScriptedChat(lambda m, tools: R1 if len(m) == 1 else R2 if len(m) == 3 else R3)
    _, calls, _ = run_question(chat, FixedSearch(), parse_setting("none"), LoopConfig("ircot", ircot_form="chat", max_turns=3), IRCOT_Q,
                               run_id="run", scorer=Scorer())
    t = Trajectory.from_dict(calls[2])
    with pytest.raises(RenderError, match=r"native: message 1 \(content\): text not found in the rendered template "
                                          r"output \(the template dropped or rewrote it\); text: message 1"):
        render(t, qwen[family])
    assert render(t, qwen["qwen2.5"]).rendering == "native"


def test_an_endpoints_reasoning_content_is_kept_and_wins(monkeypatch):
    """vLLM's reasoning parsers return the reasoning apart ("reasoning_content", or "reasoning"); the client keeps
    it and the seed002 turn uses it, as the release's deepseek_agent.py reads msg.get("reasoning_content") or
    msg.get("reasoning")."""
    from attnprobe.generation.openai_chat import OpenAIChat
    from attnprobe.studies.loop.agents import Loop

    chat = OpenAIChat("http://127.0.0.1:9/v1", "Qwen/Qwen3.5-4B")
    for key in ("reasoning_content", "reasoning"):
        msg = {"role": "assistant", "content": xml("search", query="q1 a"), key: "plan"}
        monkeypatch.setattr(chat, "_create", lambda payload, msg=msg: {
            "choices": [{"message": msg, "finish_reason": "stop"}], "usage": {"prompt_tokens": 3, "completion_tokens": 2}})
        reply = chat.complete([{"role": "user", "content": "q"}], TOOLS)
        assert reply.reasoning_content == "plan" and reply.as_message()["reasoning_content"] == "plan"
        assert [c["function"] for c in reply.tool_calls] == [{"name": "search", "arguments": '{"query": "q1 a"}'}]
        assert Loop._native(reply) == {"role": "assistant", "content": "", "reasoning_content": "plan",
                                       "tool_calls": reply.tool_calls}


def test_the_in_process_backend_reads_xml_calls_and_stops_after_a_complete_one(tiny_smol):
    """TransformersChat.make_reply parses a Qwen3.5 reply's two XML calls; with stop-at-call (the runner's
    default) generation would stop once the first call's </function> is written, as it does after a JSON call."""
    from attnprobe.generation.chat import Prompt
    from attnprobe.generation.transformers_chat import TransformersChat
    from attnprobe.studies.loop.agents import Loop

    chat = TransformersChat(tiny_smol, stop_check_every=1)
    text = "I need two searches.\n</think>\n\n" + xml("search", query="q1 a") + "\n" + xml("search", query="q2 b")
    ids = chat.tokenizer(text, add_special_tokens=False)["input_ids"]
    reply = chat.make_reply(Prompt([1], "p", "native"), ids, TOOLS, 500, [{"role": "user", "content": "q"}])
    assert reply.tool_calls == [call(1, "search", query="q1 a"), call(2, "search", query="q2 b")]
    assert (reply.raw_text, reply.finish_reason) == (text, "tool_calls")
    assert Loop._native(reply) == {"role": "assistant", "content": "", "reasoning_content": "I need two searches.",
                                   "tool_calls": reply.tool_calls}
    cut = chat.tokenizer.decode(chat.cut_at_call(ids, NAMES))
    assert cut.endswith("</function>") and parse_tool_calls(cut, NAMES)[1] == [ParsedCall("search", {"query": "q1 a"})]
