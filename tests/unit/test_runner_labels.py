"""``attnprobe run`` on the loop's question set, labelled by its whole setting, with the warnings its numbers
need (issue 29): accuracy scored from ``golden_answers``, a run named by preset and context policy, a policy
that changed no call, and an answer read from a reply cut at the token limit. Scripted chats, no model."""

from __future__ import annotations

import json

from support.fixed_search import FixedSearch
from support.scripted_chat import ScriptedChat, tool_call

from attnprobe.generation.chat import ChatReply
from attnprobe.resources import data_path
from attnprobe.studies.runner import RunSettings, run_questions

LOOP_QUESTIONS = str(data_path("questions_loop.jsonl"))


def answer_at_once(messages, tools):
    """The manager answers s01 (holmium) without delegating; no worker call, so no policy can act."""
    return "", [tool_call("call1", "final_answer", answer="holmium")]


def cli(tmp_path, monkeypatch, chat, *extra):
    from attnprobe.cli import run as cli_run
    from attnprobe.cli.main import main

    monkeypatch.setattr(cli_run, "make_chat", lambda args: chat)
    out = tmp_path / "r.jsonl"
    code = main(["run", LOOP_QUESTIONS, "--preset", "baseline", "--limit", "1", "--out", str(out), "--no-progress",
                 *extra])
    return code, out


def test_run_scores_the_loop_question_set_and_labels_the_setting(tmp_path, monkeypatch, capsys):
    code, out = cli(tmp_path, monkeypatch, ScriptedChat(answer_at_once), "--context-policy", "mask:01")
    assert code == 0
    cap = capsys.readouterr()
    summary = json.loads(out.with_suffix(".summary.json").read_text())
    assert (summary["accuracy"], summary["scored"], summary["setting"]) == (1.0, 1, "baseline_mask-1")
    row = cap.out.splitlines()[2].split()
    assert row[:2] == ["baseline_mask-1", "1/1"]  # not "baseline" under mask:1
    assert json.loads(out.with_suffix(".results.ndjson").read_text())["run_id"] == "baseline_mask-1-s01"
    assert "the context policy mask:1 acted on no call" in cap.err


def test_repeated_context_policy_is_refused_naming_the_composition(tmp_path, monkeypatch, capsys):
    import pytest

    with pytest.raises(SystemExit) as e:
        cli(tmp_path, monkeypatch, ScriptedChat(answer_at_once), "--context-policy", "mask:1",
            "--context-policy", "refine:bm25:3")
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.endswith("--context-policy: given twice (mask:1, refine:bm25:3): this command runs one setting; "
                        "compose policies with '+', e.g. --context-policy mask:1+refine:bm25:3")


def test_no_gold_answers_warns_that_accuracy_is_null(tmp_path, capsys):
    import logging

    from attnprobe.cli.main import setup_logging

    setup_logging()
    q = [{"id": "x", "question": "What?", "answers": [], "type": None}]
    res = run_questions(ScriptedChat(answer_at_once), q, RunSettings.preset("baseline"), tmp_path / "r.jsonl",
                        search=FixedSearch())
    assert res["summary"]["accuracy"] is None
    assert "no question has a gold answer" in capsys.readouterr().err
    logging.getLogger("attnprobe").handlers.clear()


class CutChat(ScriptedChat):
    """Every reply cut at the token limit: the manager's JSON call ends after its opening fence."""

    def complete(self, messages, tools=None, *, max_new_tokens=256, temperature=0.0):
        self.sent.append(messages)
        return ChatReply(content="```json\n{\"name\": \"search_w", tool_calls=[], raw_text="```json\n{\"name\"",
                         input_tokens=10, output_tokens=max_new_tokens, finish_reason="length")


def test_cut_off_reply_recorded_as_answer_is_flagged_and_warned(tmp_path, capsys):
    from attnprobe.cli.main import setup_logging

    setup_logging()
    q = [{"id": "s01", "question": "Which element?", "answers": ["holmium"], "type": None}]
    res = run_questions(CutChat(None), q, RunSettings.preset("baseline", max_new_tokens=8, manager_steps=1),
                        tmp_path / "r.jsonl", search=FixedSearch())
    r = res["results"][0]
    assert (r["answer"], r["answer_cut_off"], r["correct"]) == ("```json", True, False)
    assert res["summary"]["answers_cut_off"] == 1
    err = capsys.readouterr().err
    assert "baseline-s01: the answer '```json' was read from a reply cut at the token limit (8 new tokens)" in err
    assert "1 of 1 answers were read from replies cut at the token limit (8)" in err


def test_a_policy_that_acts_is_counted_and_not_warned(tmp_path, capsys):
    from test_runner_context import run  # the worker plan masks observations under mask:1 from its third step

    from attnprobe.cli.main import setup_logging

    setup_logging()
    _, res, _ = run(tmp_path, context_policy="mask:1")
    assert res["results"][0]["policy_acted_calls"] == res["summary"]["policy_acted_calls"] == 2  # calls 3 and 4 (mask)
    assert "acted on no call" not in capsys.readouterr().err
