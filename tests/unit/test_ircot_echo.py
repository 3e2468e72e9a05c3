"""The IRCoT parser counts only tags the model wrote: a reply that quotes its instruction ("...inside
<answer> and </answer>") has no answer "and" (issue 29). Hand-written replies, a scripted chat, no model."""

from __future__ import annotations

from support.fixed_search import FixedSearch
from support.ircot import Q
from support.scripted_chat import ScriptedChat

from attnprobe.generation.toolparse import echoed_spans, parse_tags
from attnprobe.studies.loop.agents import LoopConfig, run_question
from attnprobe.studies.loop.context import parse_setting
from attnprobe.studies.loop.prompts import IRCOT_INVALID, IRCOT_PROMPT
from attnprobe.studies.loop.scoring import Scorer

SENT = (IRCOT_PROMPT, IRCOT_INVALID)
ECHO = "I will directly provide the answer inside <answer> and </answer>, without detailed illustrations."


def test_an_echoed_instruction_is_no_answer():
    act = parse_tags(ECHO, SENT)
    assert (act.answer, act.queries, act.text) == (None, [], ECHO)  # the reply is kept whole, not cut at the echo
    assert parse_tags(ECHO).answer == "and"  # what the parser read before: the instruction's connective
    assert echoed_spans(ECHO, SENT) == [(ECHO.index("<answer>"), ECHO.index("</answer>") + len("</answer>"))]
    echo_search = "I can call a search engine by <search> query </search> and it will return results."
    assert parse_tags(echo_search, SENT).queries == []


def test_a_real_answer_after_an_echo_counts_and_the_example_text_on_its_own_counts():
    reply = ("I should put the answer between <answer> and </answer>. <think>Stockholm is Holmia.</think>"
             "<answer> holmium </answer> trailing text")
    act = parse_tags(reply, SENT)
    assert act.answer == "holmium" and act.thoughts == ["Stockholm is Holmia."]
    assert act.text == reply[: reply.index(" trailing")]
    assert parse_tags("<think>capital</think>\n<answer> Beijing </answer>", SENT).answer == "Beijing"
    assert parse_tags("For example, <answer> Beijing </answer>.", SENT).answer is None  # the example, quoted


def test_the_loop_treats_an_echo_as_an_invalid_turn_then_scores_the_real_answer():
    replies = iter([ECHO, f"<answer> {Q['answers'][0]} </answer>"])
    chat = ScriptedChat(lambda m, t: next(replies))
    result, calls, _ = run_question(chat, FixedSearch(), parse_setting("none"), LoopConfig("ircot", ircot_form="chat", max_turns=3), Q,
                                    run_id="run/none", scorer=Scorer())
    assert chat.sent[1][-1] == {"role": "user", "content": IRCOT_INVALID}  # the echo got Search-R1's feedback
    assert (result["answer"], result["correct"], len(calls)) == (Q["answers"][0], True, 2)
