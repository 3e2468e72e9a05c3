"""The Search-R1 stream (attnprobe/agents/searchr1.py) against Search-R1's generation manager, re-implemented
here from its source (PeterGriffinJin/Search-R1 @ a14dc3a, search_r1/llm_agent/generation.py), independently of
the module: the token ids the model is sent at every call and the final sequence, on hand-built replies, with the
bundled SmolLM2 tokenizer (a real byte-level BPE, so piecewise tokenization differs from whole-text)."""

from __future__ import annotations

import re

import pytest

from attnprobe.agents import searchr1
from attnprobe.trajectory.schema import Trajectory

PROMPT = ("Answer the given question. You must conduct reasoning inside <think> and </think> first every time you get "
          "new information. After reasoning, if you find you lack some knowledge, you can call a search engine by "
          "<search> query </search> and it will return the top searched results between <information> and "
          "</information>. You can search as many times as your want. If you find no further external knowledge "
          "needed, you can directly provide the answer inside <answer> and </answer>, without detailed "
          "illustrations. For example, <answer> Beijing </answer>. Question: Who wrote Hamlet?\n")


@pytest.fixture(scope="module")
def tok(bundled_folder):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(bundled_folder))


def manager(tok, prompt, replies, search, *, max_turns=4, max_prompt_length=4096, max_obs_length=500):
    """generation.py's run_llm_loop for one example: (the ids each generation is fed, the final rollings,
    the right side: responses and observations in order)."""
    chat = [{"role": "user", "content": prompt}]
    # rl_dataset.py:128-139 (truncation 'error': the prompt fits)
    rolling = tok(tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=False),
                  add_special_tokens=False)["input_ids"]
    fed, right, replies, active = [], [], iter(replies), True
    for _ in range(max_turns):  # generation.py:234
        if not active:
            break
        fed.append(list(rolling))
        resp = next(replies)
        # _postprocess_responses, generation.py:61-66 + _batch_tokenize
        resp = (resp.split('</search>')[0] + '</search>' if '</search>' in resp
                else resp.split('</answer>')[0] + '</answer>' if '</answer>' in resp else resp)
        resp_ids = tok(resp, add_special_tokens=False)["input_ids"]
        # postprocess_predictions, generation.py:422-429; execute_predictions, generation.py:385-401
        match = re.search(r'<(search|answer)>(.*?)</\1>', resp, re.DOTALL)
        action, content = (match.group(1), match.group(2).strip()) if match else (None, '')
        if action == 'answer':
            obs, active = '', False
        elif action == 'search':
            obs = f'\n\n<information>{search(content).strip()}</information>\n\n'
        else:
            obs = '\nMy previous action is invalid. \
If I want to search, I should put the query between <search> and </search>. \
If I want to give the final answer, I should put the answer between <answer> and </answer>. Let me try again.\n'
        obs_ids = tok(obs, add_special_tokens=False)["input_ids"][:max_obs_length]  # _process_next_obs, :80-89
        rolling = (rolling + resp_ids + obs_ids)[-max_prompt_length:]  # _update_rolling_state, :97-112
        right += [resp_ids, obs_ids]
    if active:  # final LLM rollout, generation.py:278-310: no observation appended
        fed.append(list(rolling))
        resp = next(replies)
        resp = (resp.split('</search>')[0] + '</search>' if '</search>' in resp
                else resp.split('</answer>')[0] + '</answer>' if '</answer>' in resp else resp)
        right.append(tok(resp, add_special_tokens=False)["input_ids"])
    return fed, right


LONG = " ".join(f"word{i} fact." for i in range(132)) + " end"  # its observation is 700 tokens: cut to 500
PAGES = {"Hamlet author": [("Hamlet", "Hamlet is a tragedy.\nIt has five acts."), ("Globe", "A theatre.")],
         "": [("Empty", "nothing asked")], "long": [("Long", LONG)]}
REPLIES = [
    "<think>I should look it up.</think>\n<search> Hamlet author </search>\n<information>made up</information>",
    "I think I know it but let me write prose with no tags at all.",     # invalid
    "<think>More.</think><search>long</search>",                         # a 700+-token observation
    "<think>Empty query.</think><search></search><answer> x </answer>",  # an empty search is a search
    "<think>Done.</think> <answer> William Shakespeare </answer> and then more text</answer>",  # final rollout
]


class Pages:
    """A search backend with known pages (title, text): the query picks them."""

    name = "pages"

    def search(self, query, k):
        from attnprobe.agents.search import SearchResult

        return [SearchResult(t, f"u/{query}/{i}", "") for i, (t, _) in enumerate(PAGES[query][:k])]

    def fetch(self, url):
        _, query, i = url.split("/")
        title, text = PAGES[query][int(i)]
        return f"{title}\n\n{text}"


def documents(query):  # generation.py:460-469 (_passages2string) over what the retriever returns
    return "".join(f"Doc {i + 1}(Title: {t}) {x}\n" for i, (t, x) in enumerate(PAGES[query]))


def run_loop(tok, replies, spec="none", **cfg):
    from support.scripted_chat import ScriptedChat

    from attnprobe.studies.loop.agents import LoopConfig, run_question
    from attnprobe.studies.loop.context import parse_setting
    from attnprobe.studies.loop.scoring import Scorer

    it = iter(replies)
    chat = ScriptedChat(lambda messages, tools: next(it), tokenizer=tok)
    q = {"id": "h1", "question": "Who wrote Hamlet", "answers": ["William Shakespeare"]}
    result, calls, history = run_question(chat, Pages(), parse_setting(spec), LoopConfig("ircot", **cfg), q,
                                          run_id=f"run/{spec}", scorer=Scorer())
    return chat, result, calls, history


def test_stream_equals_search_r1_manager(tok):
    chat, result, calls, history = run_loop(tok, REPLIES)
    fed = [r.prompt_ids for r in chat.requests]
    want_fed, right = manager(tok, PROMPT, REPLIES, documents)
    assert fed == want_fed and len(fed) == 5  # 4 turns + the final rollout
    assert [r.max_new_tokens for r in chat.requests] == [500] * 5 and {r.temperature for r in chat.requests} == {0.0}
    stream = searchr1.from_history(tok, history["messages"])  # the whole sequence, rebuilt from the history
    assert stream.ids == want_fed[0] + [t for part in right for t in part]
    assert (result["retrievals"], result["model_calls"], result["final_call"], result["final_searches"]) == \
        (3, 5, True, 0)
    assert result["answer"] == "William Shakespeare" and result["correct"] is True
    kinds = [(p.kind, p.step, p.cut) for p in stream.pieces]
    assert kinds == [("prompt", 0, 0), ("reply", 1, 0), ("information", 1, 0), ("reply", 2, 0), ("invalid", 2, 0),
                     ("reply", 3, 0), ("information", 3, kinds[6][2]), ("reply", 4, 0), ("information", 4, 0),
                     ("reply", 5, 0)]
    assert kinds[6][2] == 200 and len(stream.pieces[6].ids) == 500  # the 700-token block cut to 500 tokens
    assert not stream.pieces[6].text.endswith("</information>\n\n")  # it lost its closing tag, as in Search-R1
    assert stream.pieces[1].text.endswith("</search>") and "made up" not in stream.text()
    assert stream.pieces[2].text == ("\n\n<information>Doc 1(Title: Hamlet) Hamlet is a tragedy.\nIt has five acts."
                                     "\nDoc 2(Title: Globe) A theatre.</information>\n\n")
    assert stream.pieces[8].text == "\n\n<information>Doc 1(Title: Empty) nothing asked</information>\n\n"
    assert stream.pieces[-1].text == "<think>Done.</think> <answer> William Shakespeare </answer>"
    # the ids are not the whole text tokenized (the pieces are tokenized apart, as Search-R1 does)
    whole = tok(stream.prompt_text + stream.text(), add_special_tokens=False)["input_ids"]
    assert whole != stream.ids
    # every call is recorded as the stream through its reply, with what the model was sent
    for k, call in enumerate(calls):
        assert call["messages"][0] == {"role": "user", "content": PROMPT}
        assert call["messages"][1]["content"] == stream.text(2 * k + 2)
        assert call["meta"]["stream"]["prompt_tokens"] == len(want_fed[k])
    assert calls[3]["meta"]["stream"]["observation_tokens_cut"] == [kinds[6][2]]
    assert calls[-1]["meta"]["final_call"] is True


def test_stream_refuses_a_chat_without_tokenizer():
    with pytest.raises(ValueError, match="needs the model's tokenizer"):
        run_loop(None, REPLIES)


def test_left_truncation_and_early_answer(tok):
    replies = ["<search>Hamlet author</search>", "<answer>Shakespeare</answer> trailing"]
    n = len(searchr1.Stream(tok, PROMPT).ids)
    with pytest.raises(ValueError, match="over the"):  # Search-R1's dataset refuses a prompt over the limit
        searchr1.Stream(tok, PROMPT, max_prompt_tokens=n - 1)
    stream = searchr1.Stream(tok, PROMPT, max_prompt_tokens=n + 8)
    fed = [stream.model_input()]
    assert stream.add_reply(replies[0]) == ("search", "Hamlet author")
    stream.add_observation(searchr1.information(documents("Hamlet author")))
    fed.append(stream.model_input())
    assert stream.add_reply(replies[1]) == ("answer", "Shakespeare")
    want, right = manager(tok, PROMPT, replies, documents, max_prompt_length=n + 8)
    assert fed == want and [len(f) for f in fed] == [n, n + 8]
    assert stream.ids == want[0] + [t for part in right for t in part]
    assert stream.dropped() == len(stream.ids) - (n + 8) > 0
    assert stream.answer() == "Shakespeare"
    assert searchr1.Stream(tok, PROMPT).answer() is None  # ours: no answer the model wrote, none


def test_helpers_quote_search_r1():
    assert searchr1.cut_reply("a</answer> b<search>q</search>c") == "a</answer> b<search>q</search>"
    assert searchr1.parse_action("<answer>a</answer><search>q</search>") == ("answer", "a")
    assert searchr1.parse_action("<search>  </search>") == ("search", "")
    assert searchr1.parse_action("<search>open") == (None, "")
    assert searchr1.final_answer("<answer> Beijing </answer> ... no answer") is None
    # Search-R1's scorer over prompt + sequence: its prompt holds two <answer> spans, so no answer reads "Beijing"
    assert searchr1.final_answer(PROMPT + "<think>no idea</think>") == "Beijing"
    assert searchr1.passages([("T", "line one\nline two")]) == "Doc 1(Title: T) line one\nline two\n"
    assert searchr1.question(" Who wrote Hamlet ") == "Who wrote Hamlet?"


def test_recorded_call_labels_the_stream(tok):
    from attnprobe.render.rendering import render

    _, _, calls, history = run_loop(tok, REPLIES)
    stream = searchr1.from_history(tok, history["messages"])
    messages = stream.recorded(6)  # the third call: through its reply, before its documents
    assert calls[2]["messages"] == messages
    text = messages[1]["content"]
    assert messages[0] == {"role": "user", "content": PROMPT}
    assert text == "".join(p.text for p in stream.pieces[1:6])
    assert messages[1]["reply_start"] == len(text) - len(stream.pieces[5].text)
    anns = [(a["role"], a["author"], a["turn"], text[a["start"]:a["end"]][:24]) for a in messages[1]["annotations"]]
    assert anns == [
        ("reasoning", "self", 0, "<think>I should look it u"[:24]),
        ("tool_call", "self", 0, "<search> Hamlet author </"[:24]),
        ("observation", "external", 0, "\n\n<information>Doc 1(Tit"[:24]),
        ("reasoning", "self", 1, REPLIES[1][:24]),
        ("task", "external", 1, searchr1.INVALID[:24]),
        ("reasoning", "self", 2, "<think>More.</think><sea"),
        ("tool_call", "self", 2, "<search>long</search>"),
    ]
    rendered = render(Trajectory(id="c", messages=messages), tok)
    sent = [t for p in stream.pieces[:6] for t in p.ids]  # the ids the model read, then its reply
    assert rendered.input_ids.tolist()[:len(sent)] == sent  # tokenized in pieces (whole, they would differ)
    assert messages[1]["pieces"] == [0, *[sum(len(p.text) for p in stream.pieces[1:k]) for k in range(2, 6)]]
    by_turn = {(s.turn, s.role) for s in rendered.segments if s.role != "template"}
    assert {(0, "observation"), (1, "task"), (2, "tool_call"), (2, "reasoning")} <= by_turn
    starts = [q for q in rendered.queries_reasoning if q.message_index == 1]
    assert [q.turn for q in starts] == [0, 1, 2]
    reply_tok = starts[-1].position  # the reasoning start: the last reply's first token
    assert rendered.text[rendered.offsets[reply_tok][0]:].startswith("<think>More.")
    assert (rendered.decision.position, rendered.decision.turn) == (reply_tok - 1, 2)  # the last token read before it
    before = rendered.text[:rendered.offsets[reply_tok][0]]
    assert before.endswith(searchr1.INVALID) and rendered.offsets[reply_tok - 1][1] == len(before)


def test_the_stream_is_the_ircot_default_and_the_chat_form_keeps_its_stamps():
    from attnprobe.studies.loop.agents import LoopConfig
    from attnprobe.studies.loop.prompts import prompts_hash

    stream, chat = LoopConfig("ircot"), LoopConfig("ircot", ircot_form="chat")
    assert (stream.ircot_form, stream.max_new_tokens, stream.temperature, stream.max_turns, stream.top_k) == \
        ("stream", 500, 0.0, 4, 3)
    assert (chat.max_new_tokens, chat.temperature) == (128, 0.0)
    assert stream.to_dict()["ircot_form"] == "stream" and stream.to_dict()["prompts"] == prompts_hash("ircot-stream")
    assert "ircot_form" not in chat.to_dict() and chat.to_dict()["prompts"] == prompts_hash("ircot")  # as before
    assert "ircot_form" not in LoopConfig("seed002").to_dict()
    assert (stream.label, chat.label) == ("ircot (Search-R1 stream)", "ircot (multi-turn chat, ours)")
    assert LoopConfig("ircot", preset="cpu").max_new_tokens == 128  # an explicit preset wins
    with pytest.raises(ValueError, match="ircot_form"):
        LoopConfig("ircot", ircot_form="tags")


def test_a_policy_edits_the_pieces_the_stream_is_built_from(tok):
    replies = ["<search>Hamlet author</search>", "<search>long</search>", "<answer>Shakespeare</answer>"]
    chat, result, calls, history = run_loop(tok, replies, spec="ircot:o")
    assert result["retrievals"] == 2 and result["answer"] == "Shakespeare"
    third = calls[2]["messages"][1]["content"]
    # IRCoT-o: every query kept, only the latest documents (the first block is gone from the sequence)
    assert "Hamlet is a tragedy" not in third and "<search>Hamlet author</search>" in third and "word0 fact." in third
    view = searchr1.from_history(tok, [history["messages"][0], *history["messages"][1:2], *history["messages"][3:5]])
    assert chat.requests[2].prompt_ids == view.model_input()
    assert calls[2]["meta"]["history"]["changes"] == {"2": "removed"}


def test_token_prompts_are_refused_where_they_cannot_be_sent():
    from attnprobe.errors import AttnprobeError
    from attnprobe.generation.chat import ChatRequest, OneByOne
    from attnprobe.generation.openai_chat import OpenAIChat

    req = ChatRequest([{"role": "user", "content": "x"}], prompt_ids=[1, 2, 3])
    with pytest.raises(AttnprobeError, match="not a token sequence"):
        OpenAIChat("http://127.0.0.1:9/v1", model="m").complete_batch([req])

    class Plain(OneByOne):
        def complete(self, *a, **k):
            raise AssertionError("never called")

    with pytest.raises(ValueError, match="as token ids"):
        Plain().complete_batch([req])


def test_the_cli_refuses_the_stream_against_a_served_model_before_anything_runs(tmp_path, capsys):
    from attnprobe.cli.main import main
    from attnprobe.resources import data_path

    argv = ["study", "interference", str(data_path("questions_loop.jsonl")), "--generator", "openai",
            "--base-url", "http://127.0.0.1:9/v1", "--served-model", "m", "--out", str(tmp_path / "o")]
    assert main(argv) == 2
    assert "--ircot-form chat" in capsys.readouterr().err and not (tmp_path / "o" / "study.json").exists()
