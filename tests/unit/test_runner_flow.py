"""Runner control flow with a fake model: what the worker sees after the filter, the 'unable' note,
stage-2 validation of every step including the answer step, the task-aware final check, the step
budget a failed validation adds, and the questions-file checks.

The model is a scripted fake (``CannedChat``, implementing the ``ChatBackend`` protocol of
attnprobe/generation/chat.py with canned replies per agent): these tests pin control flow and
message contents, not model quality. The search backend is a three-page fake with known results.
"""

from __future__ import annotations

import json

import pytest

import attnprobe
from attnprobe.agents import filter as F
from attnprobe.agents.questions import read_questions
from attnprobe.agents.tools import format_results
from attnprobe.generation.chat import ChatReply
from attnprobe.generation.toolparse import parse_tool_calls
from attnprobe.studies.runner import RunSettings, SearchResult, run_questions
from attnprobe.studies.runner import validation as V
from attnprobe.studies.runner.worker import UNABLE_NOTE, rewrite_note

A = SearchResult("Holmium", "https://w.org/Holmium", "Holmium is named after Holmia, Latin for Stockholm.")
B = SearchResult("Stockholm", "https://w.org/Stockholm", "Stockholm is the capital of Sweden.")
C = SearchResult("Per Teodor Cleve", "https://w.org/Cleve", "Swedish chemist who found holmium in 1879.")
D = SearchResult("Erbium", "https://w.org/Erbium", "Erbium is named after Ytterby.")
PAGES = {"q1": [A, B, C], "q2": [D], "q3": [C, D]}
QUESTION = {"id": "h1", "question": "Which element is named after Holmia?", "answers": ["holmium"], "type": None}


class FakeSearch:
    name = "fake"

    def search(self, query, k):
        return list(PAGES.get(query, []))[:k]

    def fetch(self, url):
        hit = [r for rs in PAGES.values() for r in rs if r.url == url]
        return f"{hit[0].title}\n\n{hit[0].snippet}" if hit else None


class WordTokenizer:
    """Whitespace 'tokens', so observation token counts are known exactly."""

    @staticmethod
    def encode(text, add_special_tokens=False):
        return text.split()


def call(name, **args):
    return json.dumps({"name": name, "arguments": args})


def agent_of(messages):
    s = messages[0]["content"]
    for prefix, agent in (("You are the manager", "manager"), ("You are a search worker", "worker"),
                          ("You screen web search results", "filter"), ("You reorganise", "stage1"),
                          ("You check one reasoning step", "stage2"), ("You check whether a proposed", "final")):
        if s.startswith(prefix):
            if agent == "worker" and messages[-1]["content"] in (F.REMINDER_IN_CONTEXT, F.ASK_QUERY):
                return "filter"
            if agent == "filter" and messages[-1]["content"] == F.ASK_QUERY:
                return "ask"
            return agent
    raise AssertionError(s[:50])


class CannedChat:
    """A fake ChatBackend: each agent kind pops its next canned reply (the last one repeats)."""

    kind = "fake"
    name = "canned"
    tokenizer = WordTokenizer()

    def __init__(self, **replies):
        self.replies = {k: list(v) for k, v in replies.items()}
        self.sent: list[tuple[str, list[dict], list[dict] | None]] = []

    def complete(self, messages, tools=None, *, max_new_tokens=256, temperature=0.0):
        agent = agent_of(messages)
        self.sent.append((agent, json.loads(json.dumps(messages)), tools))
        queue = self.replies[agent]
        text = queue.pop(0) if len(queue) > 1 else queue[0]
        names = [t["function"]["name"] for t in tools] if tools else None
        content, calls = parse_tool_calls(text, names) if names else (text, [])
        tcs = [c.to_openai(f"c{len(self.sent)}_{i}") for i, c in enumerate(calls)]
        return ChatReply(content=content if tcs else text, tool_calls=tcs, raw_text=text, input_tokens=10,
                         output_tokens=2)

    def of(self, agent):
        return [m for a, m, _ in self.sent if a == agent]


MANAGER = [call("search_worker", task="Holmia element"), call("final_answer", answer="holmium")]
WORKER = [call("web_search", query="q1"), call("final_answer", answer="holmium")]
CHAIN = "S1: Holmium is named after Holmia. (from: O1)\nS2: The element is holmium. (from: S1)"


def run(tmp_path, chat, **settings):
    base = dict(validation="off", manager_steps=2, worker_steps=2)
    s = RunSettings.preset("nis-agent", **{**base, **settings})
    res = run_questions(chat, [QUESTION], s, tmp_path / "r.jsonl", search=FakeSearch())["results"][0]
    return res, attnprobe.load_trajectories(tmp_path / "r.jsonl")


def worker_observations(chat):
    """The tool observations in the worker's last call (what it saw)."""
    return [m["content"] for m in chat.of("worker")[-1] if m["role"] == "tool"]


def worker_filter_meta(trajs):
    return [e for t in trajs if t.meta["agent"] == "search_worker" for e in t.meta.get("filter", [])]


def test_chosen_sites_replace_the_observation(tmp_path):
    chat = CannedChat(manager=MANAGER, worker=WORKER, filter=[f"{C.url}\n{A.url}"])
    res, trajs = run(tmp_path, chat)
    assert worker_observations(chat) == [format_results([C, A])]  # only the chosen, in the filter's order
    w = res["workers"][0]
    assert w["filter_decisions"] == {"sites": 1} and w["replaced"] == 1 and w["unable"] == 0
    (event,) = worker_filter_meta(trajs)
    original, shown = format_results([A, B, C]), format_results([C, A])
    assert event["chosen_urls"] == [C.url, A.url] and event["replaced"] is True and event["outcome"] == "sites"
    assert event["tokens"] == {"original": len(original.split()), "shown": len(shown.split())}
    assert event["rounds"][0]["action"] == "visit_page" and event["rewrites"] == []
    # the filter call itself: no tools offered, the answer is plain text
    (f,) = [t for t in trajs if t.meta["agent"] == "filter"]
    assert f.tools is None and f.messages[1]["content"].startswith("Task: Holmia element\n\nSearch query: q1\n")


def test_result_numbers_refer_to_what_the_worker_saw(tmp_path):
    worker = [call("web_search", query="q1"), call("visit_page", url="1"), call("final_answer", answer="x")]
    chat = CannedChat(manager=MANAGER, worker=worker, filter=["3"])
    run(tmp_path, chat, worker_steps=3)
    assert worker_observations(chat) == [format_results([C]), f"{C.title}\n\n{C.snippet}"]


def test_no_rewrites_then_unable_note(tmp_path):
    chat = CannedChat(manager=MANAGER, worker=WORKER, filter=["No\nQuery: q2", "No"])
    res, trajs = run(tmp_path, chat, max_rewrites=1)
    assert worker_observations(chat) == [UNABLE_NOTE + " Queries tried: 'q1', 'q2'."]
    assert UNABLE_NOTE == "Unable to find a relevant result for this query; try a different approach."
    filt = chat.of("filter")
    assert len(filt) == 2 and "Search query: q2\n" in filt[1][1]["content"] and D.url in filt[1][1]["content"]
    w = res["workers"][0]
    assert (w["rewrites"], w["searches"], w["unable"], w["replaced"]) == (1, 2, 1, 1)
    assert w["filter_decisions"] == {"no": 2}
    (event,) = worker_filter_meta(trajs)
    assert event["outcome"] == "unable" and event["rewrites"] == ["q2"] and event["replaced"] is True


def test_no_rewrites_left_means_unable_at_once(tmp_path):
    chat = CannedChat(manager=MANAGER, worker=WORKER, filter=["No\nQuery: q2"])
    res, _ = run(tmp_path, chat, max_rewrites=0)
    assert worker_observations(chat) == [UNABLE_NOTE + " Queries tried: 'q1'."]
    assert res["workers"][0]["searches"] == 1 and len(chat.of("filter")) == 1


def test_bare_no_asks_for_a_query_then_shows_the_chosen_site(tmp_path):
    chat = CannedChat(manager=MANAGER, worker=WORKER, filter=["No", D.url], ask=["Query: q2"])
    res, trajs = run(tmp_path, chat, max_rewrites=1)
    (ask,) = chat.of("ask")
    assert ask[-2] == {"role": "assistant", "content": "No"} and ask[:-2] == chat.of("filter")[0]
    assert worker_observations(chat) == [rewrite_note("q1", "q2") + format_results([D])]
    assert res["workers"][0]["rewrites"] == 1 and res["workers"][0]["filter_calls"] == 3
    assert [t.meta.get("purpose") for t in trajs if t.meta["agent"] == "filter"] == [None, "rewrite", None]


def test_same_query_is_no_rewrite(tmp_path):
    """A 'rewrite' equal to the old query is not searched again; asking yields nothing new: unable."""
    chat = CannedChat(manager=MANAGER, worker=WORKER, filter=["No\nQuery: Q1"], ask=["q1"])
    res, _ = run(tmp_path, chat, max_rewrites=2)
    assert worker_observations(chat) == [UNABLE_NOTE + " Queries tried: 'q1'."]
    assert res["workers"][0]["searches"] == 1


def test_unparseable_reply_fails_open(tmp_path):
    chat = CannedChat(manager=MANAGER, worker=WORKER, filter=["These look like web pages."])
    res, trajs = run(tmp_path, chat)
    assert worker_observations(chat) == [format_results([A, B, C])]
    w = res["workers"][0]
    assert w["filter_decisions"] == {"unparseable": 1} and w["replaced"] == 0
    (event,) = worker_filter_meta(trajs)
    assert event["replaced"] is False and event["outcome"] == "unparseable"
    assert event["tokens"]["original"] == event["tokens"]["shown"]


def test_in_context_filter_replaces_too(tmp_path):
    chat = CannedChat(manager=MANAGER, worker=WORKER, filter=[B.url])
    run(tmp_path, chat, filter="in-context")
    (f,) = chat.of("filter")
    assert f[0]["content"].startswith("You are a search worker") and f[-2]["role"] == "tool"
    assert f[-2]["content"] == format_results([A, B, C]) and f[-1]["content"] == F.REMINDER_IN_CONTEXT
    assert worker_observations(chat) == [format_results([B])]


def test_no_filter_shows_raw_results(tmp_path):
    chat = CannedChat(manager=MANAGER, worker=WORKER)
    res, trajs = run(tmp_path, chat, filter="none")
    assert worker_observations(chat) == [format_results([A, B, C])] and not worker_filter_meta(trajs)
    assert res["workers"][0]["filter_calls"] == 0


# ------------------------------------------------------------------ validation
def test_stage2_checks_every_step_and_an_appended_answer_step(tmp_path):
    chain = "S1: Holmia is Latin for Stockholm. (from: O1)\nS2: Element 67 was named after it. (from: S1)"
    chat = CannedChat(manager=MANAGER, worker=WORKER, filter=[A.url], stage1=[chain], stage2=["VALID"],
                      final=["VALID"])
    res, trajs = run(tmp_path, chat, validation="full", final_check=True)
    v = res["validation"]
    assert v["accepted"] is True and v["answer_step_added"] is True and v["answer_step"] == "S3"
    assert v["checked"] == ["S1", "S2", "S3"] and v["unchecked"] == []
    s3 = chat.of("stage2")[2][1]["content"]
    assert "Inference [S3]: The answer to the task is holmium." in s3
    assert "[S1] Holmia is Latin for Stockholm." in s3 and "[S2] Element 67 was named after it." in s3
    assert [t.meta["answer_step"] for t in trajs if t.meta["agent"] == "validator_stage2"] == [False, False, True]
    (final,) = chat.of("final")
    assert [m["role"] for m in final] == ["system", "user"]
    assert final[1]["content"] == ("Task: Which element is named after Holmia?\n\nReasoning steps:\n"
                                   "S1: Holmia is Latin for Stockholm.\nS2: Element 67 was named after it.\n"
                                   "S3: The answer to the task is holmium.\n\nProposed answer: holmium\n\n"
                                   "Does the proposed answer answer the task?")
    assert v["final_check"] == {"verdict": "valid", "suggestion": ""}


def test_nis_agent_has_the_seeds_two_stages_and_output_limit(tmp_path):
    """Seed 000: "If all steps are valid, it confirms the final answer as correct" (4.2) -- no third
    gate in the nis-agent preset; "we limit the output token size to 4096" (C.3)."""
    s = RunSettings.preset("nis-agent")
    assert (s.validation, s.final_check, s.max_new_tokens, s.temperature) == ("full", False, 4096, 0.0)
    assert RunSettings().max_new_tokens == 4096 and RunSettings.preset("baseline").final_check is False
    chat = CannedChat(manager=MANAGER, worker=WORKER, filter=[A.url], stage1=[CHAIN], stage2=["VALID"],
                      final=["INVALID: never asked"])
    res, trajs = run(tmp_path, chat, validation="full")
    v = res["validation"]
    assert chat.of("final") == [] and "final_check" not in v and v["accepted"] is True
    assert {t.meta["agent"] for t in trajs} >= {"validator_stage1", "validator_stage2"}
    assert "validator_final" not in {t.meta["agent"] for t in trajs} and res["answer"] == "holmium"


def test_chain_ending_with_the_answer_gets_no_extra_step():
    items = V.memory_items("t", [("a", "o")])
    steps, _ = V.parse_chain(CHAIN, items, "holmium")
    assert V.with_answer_step(steps, "Holmium")[1] is False
    steps2, added = V.with_answer_step(steps, "erbium")
    assert added and steps2[-1].label == "S3" and steps2[-1].cites == ["S1", "S2"]


def test_validation_cap_always_keeps_the_answer_step():
    steps = [V.Step(f"S{i}", f"c{i}") for i in range(1, 6)]
    checked, unchecked = V.steps_to_check(steps, 2)
    assert [s.label for s in checked] == ["S1", "S5"] and unchecked == ["S2", "S3", "S4"]
    checked, unchecked = V.steps_to_check(steps, 1)
    assert [s.label for s in checked] == ["S5"] and unchecked == ["S1", "S2", "S3", "S4"]
    assert V.steps_to_check(steps, 8) == (steps, [])


def test_failed_final_check_extends_the_manager_budget(tmp_path):
    manager = [call("final_answer", answer="Stockholm"), call("search_worker", task="Holmia element"),
               call("final_answer", answer="holmium")]
    chat = CannedChat(manager=manager, worker=WORKER, filter=[A.url], stage1=[CHAIN], stage2=["VALID"],
                      final=["INVALID: the task asks for an element, not a city"])
    res, _ = run(tmp_path, chat, validation="full", manager_steps=1, validation_extra_steps=3, final_check=True)
    v = res["validation"]
    assert v["accepted"] is False and v["extra_steps"] == 3 and v["proposed_answer"] == "Stockholm"
    assert all(x["verdict"] == "valid" for x in v["verdicts"])
    assert v["final_check"]["suggestion"] == "the task asks for an element, not a city"
    feedback = chat.of("manager")[1][-1]["content"]
    assert "does the answer answer the task? invalid: the task asks for an element" in feedback
    assert feedback.endswith("You have 3 more step(s).")
    assert (res["answer"], res["correct"], res["forced_answer"], res["manager_steps"]) == ("holmium", True, False, 3)


def test_without_extension_the_manager_is_out_of_steps(tmp_path):
    manager = [call("final_answer", answer="Stockholm"), call("final_answer", answer="holmium")]
    chat = CannedChat(manager=manager, worker=WORKER, stage1=[CHAIN], stage2=["INVALID: no"], final=["VALID"])
    res, _ = run(tmp_path, chat, validation="full", manager_steps=1, validation_extra_steps=0)
    assert res["forced_answer"] is True and res["manager_steps"] == 1 and res["validation"]["extra_steps"] == 0


def test_summary_counts_filter_and_validation(tmp_path):
    chat = CannedChat(manager=MANAGER, worker=WORKER, filter=["No\nQuery: q2", "No"], stage1=[CHAIN],
                      stage2=["VALID"], final=["INVALID: unit"])
    run(tmp_path, chat, validation="full", final_check=True)
    s = json.loads((tmp_path / "r.summary.json").read_text())
    assert s["filter"] == {"calls": 2, "no": 2, "sites": 0, "keep": 0, "unparseable": 0, "rewrites": 1,
                           "replaced": 1, "unable": 1}
    assert s["validation"] == {"run": 1, "accepted": 0, "failed": 1, "extended": 1}
    assert s["total_calls"] == len(chat.sent) and s["total_input_tokens"] == 10 * len(chat.sent)


# ------------------------------------------------------------------ questions file
@pytest.mark.parametrize("line, message", [
    # the shared reader (attnprobe.agents.questions, issue 26): numbers are accepted as ids and aliases
    ('{"id": "b", "question": "Q?", "aliases": [{"x": 1}]}', "line 2: field 'aliases': expected a string or number "
                                                             "or a non-empty list of them, got a list with a non-string item"),
    ('{"id": true, "question": "Q?"}', "line 2: field 'id': use 1-128 letters"),
    ('{"id": "b"}', "line 2: field 'question': missing"),
    ('{"id": "b", "question": ["Q?"]}', "line 2: field 'question': must be a non-empty string"),
    ('{"id": "b", "question": "Q?", "answer": {"x": 1}}', "line 2: field 'answer': an answer object needs"),
    ('{"id": "b", "question": "Q?", "answer": true}', "line 2: field 'answer'"),
    ('{"id": "a", "question": "Q?"}', "line 2: field 'id': duplicate id 'a'"),
    ('{"id": "b c", "question": "Q?"}', "line 2: field 'id': use 1-128 letters"),
    ('["Q?"]', "line 2: expected a JSON object, got list"),
    ('{"id": "b", "question": "Q?"', "line 2"),
])
def test_bad_questions_name_file_line_and_field(tmp_path, line, message):
    path = tmp_path / "q.jsonl"
    path.write_text('{"id": "a", "question": "Fine?", "answer": ["x", 1], "aliases": ["y"]}\n' + line + "\n")
    with pytest.raises(attnprobe.AttnprobeError) as info:
        read_questions(path)
    text = str(info.value)
    assert text.startswith(f"{path}, line 2") and message in text and "\n" not in text


def test_bad_questions_fail_before_any_model_is_loaded(tmp_path, monkeypatch, capsys):
    import attnprobe.cli.run as cli_run
    from attnprobe.cli.main import main

    def no_model(args):
        raise AssertionError("a model was opened before the questions were checked")

    monkeypatch.setattr(cli_run, "make_chat", no_model)
    path = tmp_path / "q.jsonl"
    path.write_text('{"id": "a", "question": "Q?", "aliases": [{"x": 1}]}\n')
    assert main(["run", str(path), "--out", str(tmp_path / "o.jsonl")]) == 2
    err = capsys.readouterr().err
    assert f"{path}, line 1: field 'aliases'" in err


def test_runner_reads_golden_answers_and_scores_with_the_shared_em(tmp_path):
    """Issue 26 item 10: the runner reads FlashRAG's ``golden_answers`` (its old reader ignored them and left
    such questions unscored) and scores with the one EM the loop uses."""
    path = tmp_path / "q.jsonl"
    path.write_text(json.dumps({"id": "h1", "question": QUESTION["question"],
                                "golden_answers": ["Holmium (element)", "The holmium"]}) + "\n")
    (q,) = read_questions(path)
    assert q["answers"] == ["Holmium (element)", "The holmium"]
    chat = CannedChat(manager=MANAGER, worker=WORKER, filter=[A.url])
    s = RunSettings.preset("nis-agent", validation="off", manager_steps=2, worker_steps=2)
    res = run_questions(chat, [q], s, tmp_path / "r.jsonl", search=FakeSearch())["results"][0]
    assert (res["answer"], res["gold"], res["correct"]) == ("holmium", ["Holmium (element)", "The holmium"], True)


def test_resume_reruns_a_question_whose_text_or_gold_changed(tmp_path):
    """Issue 27: 'done' means the same inputs. A question whose gold answers (or text) changed since it ran is
    run again on --resume (its old calls are dropped, not replayed) and scored against the new gold; an
    unchanged one is skipped."""
    s = RunSettings.preset("nis-agent", validation="off", manager_steps=2, worker_steps=2, filter="none")
    out = tmp_path / "r.jsonl"
    first = run_questions(CannedChat(manager=MANAGER, worker=WORKER), [QUESTION], s, out, search=FakeSearch())
    assert first["results"][0]["correct"] is True
    n_calls = len(attnprobe.load_trajectories(out))
    same = run_questions(CannedChat(manager=MANAGER, worker=WORKER), [QUESTION], s, out, search=FakeSearch(),
                         resume=True)
    assert same["skipped"] == 1
    new_gold = {**QUESTION, "answers": ["erbium"]}
    again = run_questions(CannedChat(manager=MANAGER, worker=WORKER), [new_gold], s, out, search=FakeSearch(),
                          resume=True)
    assert again["skipped"] == 0
    (res,) = again["results"]
    assert res["gold"] == ["erbium"] and res["answer"] == "holmium" and res["correct"] is False
    assert len(attnprobe.load_trajectories(out)) == n_calls  # the old question's calls replaced, not kept beside
    new_text = {**new_gold, "question": "Which element is named after Stockholm?"}
    third = run_questions(CannedChat(manager=MANAGER, worker=WORKER), [new_text], s, out, search=FakeSearch(),
                          resume=True)
    assert third["skipped"] == 0 and third["results"][0]["question"] == new_text["question"]
    assert json.loads(out.with_suffix(".summary.json").read_text())["runs"] == 1


def test_summary_caveat_when_the_policy_saw_no_search(tmp_path):
    """Issue 29: under a context policy, a run whose workers never searched says in its summary that the
    policy acted on nothing; a run that searched says nothing."""
    quiet = CannedChat(manager=MANAGER, worker=[call("final_answer", answer="holmium")], filter=[A.url])
    run(tmp_path / "quiet", quiet, context_policy="mask:1")
    s = json.loads((tmp_path / "quiet" / "r.summary.json").read_text())
    assert s["caveats"] == ["setting mask:1 retrieved nothing: no policy acted (no search worker ran a search in "
                            "1 run); the policy changed nothing the agents saw",
                            "the context policy mask:1 acted on no call (nothing to mask or refine): these runs "
                            "equal runs without it"]  # the cause, then what the worker counted (policy_acted_calls)
    run(tmp_path / "busy", CannedChat(manager=MANAGER, worker=WORKER, filter=[A.url]), context_policy="mask:1")
    # it searched once: not "retrieved nothing", but mask:1 keeps the latest turn, so it still acted on no call
    assert json.loads((tmp_path / "busy" / "r.summary.json").read_text())["caveats"] == [
        "the context policy mask:1 acted on no call (nothing to mask or refine): these runs equal runs without it"]
