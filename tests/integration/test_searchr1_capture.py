"""The Search-R1 stream in process and captured (issue 37): the tiny random-weight SmolLM2 is sent each call's
token ids as they are (no rendering of its messages), and a recorded call captures with ``study attention``'s
decision on the last token before that call's reply and its reasoning start on the reply's first token, with
the earlier replies, documents and the invalid-action text as past turns."""

from __future__ import annotations

import pytest
from support.fixed_search import FixedSearch

from attnprobe.agents import searchr1
from attnprobe.generation.transformers_chat import TransformersChat
from attnprobe.studies.loop.agents import LoopConfig, run_question
from attnprobe.studies.loop.context import parse_setting
from attnprobe.studies.loop.scoring import Scorer
from attnprobe.trajectory.schema import Trajectory


class Replies(TransformersChat):
    """The real in-process backend, whose generated text is replaced by scripted replies after it ran: the
    prompt ids and counts are the model's, the replies fixed (a random model writes no tags)."""

    script = ["<think>a</think><search>q1 x</search>", "no tags here", "<think>b</think><search>q2 y</search>"]

    def complete_batch(self, requests):
        replies = super().complete_batch(requests)
        for r in replies:
            r.raw_text = r.content = self.script[min(len(self.seen), len(self.script) - 1)]
            self.seen.append(r.prompt.ids)
        return replies


def test_stream_runs_in_process_and_captures_at_the_calls_reply(tiny_smol):
    import attnprobe
    from attnprobe.studies.loop.attention import _query_masks, call_record

    chat = Replies(tiny_smol)
    chat.seen = []
    q = {"id": "t1", "question": "What is the answer?", "answers": ["42"]}
    result, calls, history = run_question(chat, FixedSearch(), parse_setting("none"),
                                          LoopConfig("ircot", max_turns=3, max_new_tokens=2), q, run_id="r/none",
                                          scorer=Scorer())
    assert (result["retrievals"], result["model_calls"], result["final_call"]) == (2, 4, True)
    tok = tiny_smol.tokenizer
    stream = searchr1.from_history(tok, history["messages"][:-1])
    # the model read exactly the stream's ids at every call (prompt tokens = the ids sent)
    sent = [c["meta"]["stream"]["prompt_tokens"] for c in calls]
    assert sent == [c["meta"]["usage"]["input_tokens"] for c in calls]
    assert sent[-1] == len(stream.ids)
    assert chat.seen[-1] == stream.ids  # the prompt the model read: the stream's ids as they are
    call = calls[2]  # the third call: after a search and an invalid turn
    res = attnprobe.capture(tiny_smol, Trajectory.from_dict(call), queries="reasoning+decision", layers=[0])
    # the capture reads the ids the model was sent (the pieces tokenized apart), then the reply and the end marker
    reply_ids = tok(stream.pieces[5].text, add_special_tokens=False)["input_ids"]
    assert res.input_ids.tolist()[:len(chat.seen[2]) + len(reply_ids)] == chat.seen[2] + reply_ids
    dec = next(qp for qp in res.queries if qp.kind == "decision")
    starts = [qp for qp in res.queries if qp.kind == "reasoning" and qp.message_index == 1]
    assert [qp.turn for qp in starts] == [0, 1, 2]
    text = res.text
    reply_at = int(res.offsets[starts[-1].position][0])
    assert text[reply_at:].startswith("<think>b</think><search>q2 y</search>")
    assert (dec.position, dec.turn) == (starts[-1].position - 1, 2) and text[:reply_at].endswith(searchr1.INVALID)
    rec = call_record(res)
    _, kind, masks = _query_masks(res)
    assert kind == "reasoning" and rec["step"] == 2 and set(rec["queries"]) == {"decision", "reasoning"}
    assert res.queries[masks["reasoning"][0]].position == starts[-1].position
    shares = rec["queries"]["decision"]["shares"]
    assert shares["past_observation"] > 0 and shares["past_reasoning"] > 0 and shares["past_tool_call"] > 0
    assert abs(sum(shares.values()) - 1) < 1e-4


@pytest.mark.slow
def test_a_stream_study_and_its_attention_through_the_cli(tmp_path, tiny_smol_folder):
    import json

    from attnprobe.cli.main import main
    from attnprobe.resources import data_path

    out = tmp_path / "study"
    assert main(["-q", "study", "interference", str(data_path("questions_loop.jsonl")), "--limit", "2", "--policy",
                 "none", "--policy", "ircot:o", "--model", str(tiny_smol_folder), "--max-new-tokens", "12",
                 "--max-turns", "2", "--out", str(out)]) == 0
    assert main(["-q", "study", "attention", str(out), "--layers", "0", "--shares-min-past", "1"]) == 0
    study = json.loads((out / "study.json").read_text())
    assert study["config"]["ircot_form"] == "stream" and study["config"]["max_tokens"] == 12
    assert (out / "study.md").read_text().startswith("# Interference study: scaffold ircot (Search-R1 stream)")
    calls = [json.loads(line) for line in (out / "none" / "calls.jsonl").read_text().splitlines()]
    assert len(calls) == 6 and all(c["meta"]["stream"]["prompt_tokens"] == c["meta"]["usage"]["input_tokens"]
                                   for c in calls)
    assert [len(c["messages"]) for c in calls] == [2] * 6  # the prompt and the one growing sequence
    attention = json.loads((out / "attention.json").read_text())
    assert set(attention["settings"]) == {"none", "ircot:o"}
