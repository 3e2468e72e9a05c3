"""Runner tests with a scripted chat backend (fast, no model): isolation of the filter and of
validation stage 2, recording round trip, robustness to unparsable replies, resume, search, CLI."""

from __future__ import annotations

import json

import pytest
from support.paths import ROOT  # noqa: E402

import attnprobe
from attnprobe.agents import filter as F
from attnprobe.agents.answers import exact_match, normalize_answer
from attnprobe.agents.questions import read_questions as load_questions
from attnprobe.generation.chat import ChatReply
from attnprobe.generation.toolparse import call_ids, parse_tool_calls
from attnprobe.studies.runner import (
    BM25Search,
    HTTPSearch,
    RunSettings,
    SearchConfigError,
    run_questions,
)
from attnprobe.studies.runner import validation as V

QUESTIONS = ROOT / "trajectories" / "questions.jsonl"


def call(name, **args):
    return json.dumps({"name": name, "arguments": args})


class ScriptedChat:
    """Replies chosen by a policy(agent_kind, messages, n) -> text; tool calls parsed like the real backends."""

    name = "scripted"

    def __init__(self, policy, fail_after: int | None = None):
        self.policy = policy
        self.sent: list[tuple[list[dict], list[dict] | None]] = []
        self.fail_after = fail_after

    @staticmethod
    def kind(messages):
        s = messages[0]["content"]
        if s.startswith("You are the manager"):
            return "manager"
        if s.startswith("You are a search worker"):
            if messages[-1]["content"] == F.ASK_QUERY:
                return "filter-rewrite"
            return "filter-in-context" if "<system-reminder>" in messages[-1]["content"] else "worker"
        if s.startswith("You screen web search results"):
            return "filter-rewrite" if messages[-1]["content"] == F.ASK_QUERY else "filter"
        if s.startswith("You reorganise"):
            return "stage1"
        if s.startswith("You check one reasoning step"):
            return "stage2"
        if s.startswith("You check whether a proposed answer"):
            return "final"
        raise AssertionError(s[:60])

    def complete(self, messages, tools=None, *, max_new_tokens=256, temperature=0.0):
        if self.fail_after is not None and len(self.sent) >= self.fail_after:
            raise KeyboardInterrupt
        self.sent.append((json.loads(json.dumps(messages)), tools))
        k = self.kind(messages)
        # stateless like a real model: n = 1 + the number of earlier replies in this context
        n = 1 + sum(1 for m in messages if m["role"] == "assistant")
        text = self.policy(k, messages, n)
        names = [t["function"]["name"] for t in tools] if tools else None
        content, calls = parse_tool_calls(text, names)
        tcs = [c.to_openai(i) for c, i in zip(calls, call_ids(messages, len(calls)))]
        return ChatReply(content=content if tcs else text, tool_calls=tcs, raw_text=text,
                         input_tokens=sum(len(str(m.get("content"))) for m in messages) // 4,
                         output_tokens=max(1, len(text) // 4))


def good_policy(kind, messages, n):
    """A competent agent: delegate, search twice (the filter rewrites the first), read, answer."""
    if kind == "manager":
        if n == 1:
            return call("search_worker", task="element named after Holmia")
        return call("final_answer", answer="holmium")
    if kind == "worker":
        return [call("web_search", query="Stockholm capital"), call("web_search", query="Holmia element name"),
                call("visit_page", url="https://en.wikipedia.org/wiki/Holmium"),
                call("final_answer", answer="holmium")][min(n, 4) - 1]
    if kind in ("filter", "filter-in-context"):
        if kind == "filter":
            judged_first = "Search query: Stockholm capital\n" in messages[-1]["content"]
        else:
            judged_first = ("Stockholm capital" in json.dumps(messages[-3].get("tool_calls"))
                            and "searched again" not in messages[-2]["content"])
        if judged_first:
            return "No\nQuery: element named after Holmia Latin Stockholm"
        return "https://en.wikipedia.org/wiki/Holmium"
    if kind == "stage1":
        return ("S1: Holmium is named after Holmia, the Latin name for Stockholm. (from: O1)\n"
                "S2: So the element is holmium. (from: S1, T)")
    if kind in ("stage2", "final"):
        return "VALID"
    raise AssertionError(kind)


@pytest.fixture(scope="module")
def bm25():
    return BM25Search()


def one_question(qid="q01"):
    return [q for q in load_questions(QUESTIONS) if q["id"] == qid]


def test_isolated_filter_prompt_holds_only_task_query_results(tmp_path, bm25):
    chat = ScriptedChat(good_policy)
    settings = RunSettings.preset("nis-agent", worker_steps=4)
    out = run_questions(chat, one_question(), settings, tmp_path / "r.jsonl", search=bm25)
    res = out["results"][0]
    assert res["answer"] == "holmium" and res["correct"] is True
    filt = [m for m, _ in chat.sent if ScriptedChat.kind(m) == "filter"]
    assert len(filt) == 3  # 1st search judged irrelevant -> rewrite judged; 2nd search judged
    worker_msgs = [m for m, _ in chat.sent if ScriptedChat.kind(m) == "worker"]
    worker_system = worker_msgs[0][0]["content"]
    for msgs in filt:
        assert [m["role"] for m in msgs] == ["system", "user"]
        user = msgs[1]["content"]
        assert user.startswith("Task: element named after Holmia\n\nSearch query: ")
        assert "Search results:" in user
        assert worker_system not in json.dumps(msgs) and "search worker" not in json.dumps(msgs)
    # the 3rd filter call judges the worker's 2nd search: nothing of the 1st search or its rewrite leaks in
    third = filt[2][1]["content"]
    assert "Holmia element name" in third
    assert "Stockholm capital" not in third and "irrelevant" not in third
    first_results = bm25.search("Stockholm capital", 4)
    second_results = {r.url for r in bm25.search("Holmia element name", 4)}
    assert any(r.url not in second_results and r.url in filt[0][1]["content"] for r in first_results)
    assert not any(r.url in third for r in first_results if r.url not in second_results)
    # the worker saw the rewrite
    worker_obs = [m["content"] for m in worker_msgs[1] if m["role"] == "tool"]
    assert "searched again with 'element named after Holmia Latin Stockholm'" in worker_obs[0]
    assert res["workers"][0]["rewrites"] == 1


def test_in_context_filter_sees_worker_history(tmp_path, bm25):
    chat = ScriptedChat(good_policy)
    run_questions(chat, one_question(), RunSettings.preset("nis-agent", filter="in-context", worker_steps=4),
                  tmp_path / "r.jsonl", search=bm25)
    filt = [m for m, _ in chat.sent if ScriptedChat.kind(m) == "filter-in-context"]
    assert filt
    for msgs in filt:
        assert msgs[0]["content"].startswith("You are a search worker")
        assert msgs[1]["content"].startswith("Task: element named after Holmia")
        assert msgs[-2]["role"] == "tool" and "<system-reminder>" in msgs[-1]["content"]


def test_no_filter_makes_no_filter_calls(tmp_path, bm25):
    chat = ScriptedChat(good_policy)
    run_questions(chat, one_question(), RunSettings.preset("baseline", worker_steps=4), tmp_path / "r.jsonl",
                  search=bm25)
    kinds = {ScriptedChat.kind(m) for m, _ in chat.sent}
    assert kinds == {"manager", "worker"}


def test_stage2_sees_only_cited_premises(tmp_path, bm25):
    chat = ScriptedChat(good_policy)
    out = run_questions(chat, one_question(), RunSettings.preset("nis-agent", worker_steps=4),
                        tmp_path / "r.jsonl", search=bm25)
    s1 = [m for m, _ in chat.sent if ScriptedChat.kind(m) == "stage1"]
    s2 = [m for m, _ in chat.sent if ScriptedChat.kind(m) == "stage2"]
    assert len(s1) == 1 and len(s2) == 2
    memory = s1[0][1]["content"]
    assert "[T] Which chemical element" in memory and "[O1] search_worker('element named after Holmia')" in memory
    step1, step2 = s2[0][1]["content"], s2[1][1]["content"]
    assert "[O1]" in step1 and "[T]" not in step1 and "Inference [S1]: Holmium is named after Holmia" in step1
    assert "[S1] Holmium is named after Holmia" in step2 and "[T] Which chemical element" in step2
    assert "[O1]" not in step2 and "search_worker" not in step2  # the observation itself is not a premise of S2
    for msgs in s2:
        assert [m["role"] for m in msgs] == ["system", "user"]
        assert "You are the manager" not in json.dumps(msgs)
    v = out["results"][0]["validation"]
    assert v["accepted"] is True and [x["verdict"] for x in v["verdicts"]] == ["valid", "valid"]


def test_validation_rejection_goes_back_to_manager(tmp_path, bm25):
    def policy(kind, messages, n):
        if kind == "stage2":
            return "INVALID: the observation does not mention the element"
        if kind == "manager" and n == 2:
            return call("final_answer", answer="erbium")
        if kind == "manager" and n == 3:
            assert "Validation found problems" in messages[-1]["content"]
            assert messages[-1]["role"] == "tool"
            return call("final_answer", answer="holmium")
        return good_policy(kind, messages, n)

    chat = ScriptedChat(policy)
    res = run_questions(chat, one_question(), RunSettings.preset("nis-agent", worker_steps=4, manager_steps=4),
                        tmp_path / "r.jsonl", search=bm25)["results"][0]
    assert res["validation"]["accepted"] is False and res["validation"]["proposed_answer"] == "erbium"
    assert res["answer"] == "holmium"
    kinds = [ScriptedChat.kind(m) for m, _ in chat.sent]
    assert kinds.count("stage1") == 1  # validation runs once, on the first proposed answer


def test_stage1_only_returns_chain_to_manager(tmp_path, bm25):
    chat = ScriptedChat(good_policy)
    res = run_questions(chat, one_question(), RunSettings.preset("nis-agent", validation="stage1", worker_steps=4,
                                                                  manager_steps=4),
                        tmp_path / "r.jsonl", search=bm25)["results"][0]
    kinds = [ScriptedChat.kind(m) for m, _ in chat.sent]
    assert "stage1" in kinds and "stage2" not in kinds
    last_manager = [m for m, _ in chat.sent if ScriptedChat.kind(m) == "manager"][-1]
    assert "Validation, stage 1" in last_manager[-1]["content"] and "S1: Holmium" in last_manager[-1]["content"]
    assert res["answer"] == "holmium"


def test_recording_round_trips(tmp_path, bm25):
    chat = ScriptedChat(good_policy)
    out_path = tmp_path / "r.jsonl"
    run_questions(chat, one_question(), RunSettings.preset("nis-agent", worker_steps=4), out_path, search=bm25)
    trajs = attnprobe.load_trajectories(out_path)
    assert len(trajs) == len(chat.sent)
    for traj, (sent, tools) in zip(trajs, chat.sent):
        assert traj.messages[:-1] == sent  # exactly what was sent ...
        assert traj.messages[-1]["role"] == "assistant"  # ... plus the reply
        assert traj.tools == tools and traj.framing == "trace"
        m = traj.meta
        assert m["runner"] == "nis-agent" and m["run_id"] == "nis-agent-q01"
        assert traj.id == f"nis-agent-q01/{m['agent']}-{sum(1 for t in trajs[:m['call_index']] if t.meta['agent'] == m['agent'])}"
        assert m["usage"]["input_tokens"] > 0 and m["usage"]["output_tokens"] > 0
        assert m["settings"]["filter"] == "isolated"
    agents = {t.meta["agent"] for t in trajs}
    # seed 000 4.2: two validation stages; the task-aware final check is ours and off by default
    assert agents == {"manager", "search_worker", "filter", "validator_stage1", "validator_stage2"}
    # save -> load keeps everything
    attnprobe.save_trajectories(trajs, tmp_path / "copy.jsonl")
    assert [t.to_dict() for t in attnprobe.load_trajectories(tmp_path / "copy.jsonl")] == [t.to_dict() for t in trajs]
    res = [json.loads(x) for x in (tmp_path / "r.results.ndjson").read_text().splitlines()]
    assert res[0]["input_tokens"] == sum(t.meta["usage"]["input_tokens"] for t in trajs)
    assert res[0]["output_tokens"] == sum(t.meta["usage"]["output_tokens"] for t in trajs)
    summary = json.loads((tmp_path / "r.summary.json").read_text())
    assert summary["accuracy"] == 1.0 and summary["per_agent_mean"]["filter"]["calls"] == 3


def test_unparsable_replies_never_crash(tmp_path, bm25):
    chat = ScriptedChat(lambda kind, messages, n: "print(open('/etc/passwd').read())  # not a tool call")
    res = run_questions(chat, load_questions(QUESTIONS)[:2], RunSettings.preset("nis-agent"), tmp_path / "r.jsonl",
                        search=bm25)["results"]
    for r in res:
        assert r["manager_parse_failures"] == 3 and r["forced_answer"] is True and r["correct"] is False
    trajs = attnprobe.load_trajectories(tmp_path / "r.jsonl")
    assert len(trajs) == 2 * 4
    assert all(t.meta["parsed_tool_calls"] == 0 for t in trajs)


def test_empty_reply_is_recorded_validly(tmp_path, bm25):
    chat = ScriptedChat(lambda kind, messages, n: "")
    run_questions(chat, one_question(), RunSettings.preset("baseline"), tmp_path / "r.jsonl", search=bm25)
    trajs = attnprobe.load_trajectories(tmp_path / "r.jsonl")
    assert all(t.meta.get("empty_reply") for t in trajs)


def test_resume_after_interrupt_has_no_duplicates(tmp_path, bm25):
    qs = load_questions(QUESTIONS)[:2]
    settings = RunSettings.preset("nis-agent", worker_steps=4)
    ref = tmp_path / "ref.jsonl"
    run_questions(ScriptedChat(good_policy), qs, settings, ref, search=bm25)
    ref_trajs = attnprobe.load_trajectories(ref)
    ref_ids = [t.id for t in ref_trajs]
    per_run = sum(1 for t in ref_trajs if t.meta["run_id"] == "nis-agent-q01")
    assert per_run == len(ref_ids) - per_run
    out = tmp_path / "r.jsonl"
    crash_at = per_run + 3  # in the middle of the second question
    with pytest.raises(KeyboardInterrupt):
        run_questions(ScriptedChat(good_policy, fail_after=crash_at), qs, settings, out, search=bm25)
    assert len(attnprobe.load_trajectories(out)) == crash_at  # nothing finished was lost
    with pytest.raises(attnprobe.AttnprobeError, match="already has records: resume it"):
        run_questions(ScriptedChat(good_policy), qs, settings, out, search=bm25, resume=False)  # the opt-out
    chat = ScriptedChat(good_policy)
    res = run_questions(chat, qs, settings, out, search=bm25)  # a rerun resumes by default (issue 28)
    assert res["skipped"] == 1
    assert len(chat.sent) == per_run - 3  # only the calls that had not been made
    ids = [t.id for t in attnprobe.load_trajectories(out)]  # raises on duplicate ids
    assert sorted(ids) == sorted(ref_ids)
    results = [json.loads(x) for x in (tmp_path / "r.results.ndjson").read_text().splitlines()]
    assert [r["question_id"] for r in results] == ["q01", "q02"]
    assert results[1]["replayed_calls"] == 3
    # the resumed file is the uninterrupted one: same messages, same tool-call ids (issue 13, item 10)
    by_id = {t.id: t.messages for t in ref_trajs}
    for t in attnprobe.load_trajectories(out):
        assert t.messages == by_id[t.id], t.id


def test_call_ids_follow_the_context():
    ctx = [{"role": "user", "content": "q"},
           {"role": "assistant", "content": "", "tool_calls": [{"id": "call1"}, {"id": "call2"}]},
           {"role": "tool", "tool_call_id": "call1", "content": "a"}]
    assert call_ids(ctx, 2) == ["call3", "call4"]
    assert call_ids(ctx[:1], 1, "c") == ["c1"]
    assert call_ids(ctx, 0) == []


def test_resume_drops_stale_calls_when_replay_diverges(tmp_path, bm25):
    qs = one_question()
    settings = RunSettings.preset("nis-agent", worker_steps=4)
    out = tmp_path / "r.jsonl"
    with pytest.raises(KeyboardInterrupt):
        run_questions(ScriptedChat(good_policy, fail_after=4), qs, settings, out, search=bm25)

    def other(kind, messages, n):  # the 2nd worker call now differs from the recorded one
        if kind == "worker" and n == 1:
            return call("web_search", query="holmium etymology")
        return good_policy(kind, messages, n)

    run_questions(ScriptedChat(other), qs, settings, out, search=bm25, resume=True)
    trajs = attnprobe.load_trajectories(out)
    assert [t.meta["call_index"] for t in trajs] == list(range(1, len(trajs) + 1))


def test_normalised_exact_match():
    """The runner scores with the shared EM (issue 26): SQuAD / Search-R1 normalisation, no accent folding."""
    golds = ["Great Eastern", "SS Great Eastern"]
    assert exact_match("the Great Eastern.", golds) and exact_match("SS Great Eastern", golds)
    assert not exact_match("Great Eastern, captained by Anderson", golds)
    assert normalize_answer("Akashi Kaikyō  Bridge") == "akashi kaikyō bridge"  # was "kaikyo" before issue 26
    assert exact_match("1,991", ["1991"])
    assert exact_match("x", []) is None


def test_questions_are_answerable_from_the_corpus(bm25):
    qs = load_questions(QUESTIONS)
    assert 10 <= len(qs) <= 20 and len(bm25.docs) >= 200
    for q in qs:
        pages = [bm25.fetch(r.url) for r in bm25.search(q["question"], 4)]
        assert any(normalize_answer(g) in normalize_answer(p) for p in pages for g in q["answers"]), q["id"]


def test_sample_topics_are_in_the_corpus(bm25):
    for query, must in [("Per Teodor Cleve holmium", "Cleve"), ("Ulf von Euler Nobel 1970", "1970"),
                        ("Akashi Kaikyo Great Belt Humber span", "Humber"),
                        ("James Webb launch Ariane 5 Kourou", "25 December 2021"),
                        ("Great Eastern 1866 cable captain", "James Anderson")]:
        assert any(must in bm25.fetch(r.url) for r in bm25.search(query, 4)), query


def test_find_in_page_is_literal_not_regex(bm25):
    from attnprobe.agents.tools import ToolBox

    tb = ToolBox(bm25)
    assert "Holmia" in tb.find_in_page("https://en.wikipedia.org/wiki/Holmium", "Holmia")
    assert tb.find_in_page("https://en.wikipedia.org/wiki/Holmium", "(a+)+$").startswith("No sentence")
    assert tb.visit_page("file:///etc/passwd").startswith("Error")


def test_http_search_needs_key(monkeypatch):
    monkeypatch.delenv("ATTNPROBE_SEARCH_KEY", raising=False)
    monkeypatch.delenv("ATTNPROBE_SEARCH_PROVIDER", raising=False)
    with pytest.raises(SearchConfigError, match="ATTNPROBE_SEARCH_KEY"):
        HTTPSearch()
    with pytest.raises(SearchConfigError, match="ATTNPROBE_SEARCH_URL"):
        HTTPSearch("searxng")


def test_http_search_against_local_server(monkeypatch):
    """The generic provider against a real local HTTP server (search + page fetch; the local page is
    allowed explicitly: private addresses are refused by default)."""
    import threading

    monkeypatch.setenv("ATTNPROBE_ALLOW_PRIVATE_URLS", "1")
    from http.server import BaseHTTPRequestHandler, HTTPServer

    class H(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            if self.path.startswith("/search"):
                body = json.dumps({"results": [{"title": "Holmium", "url": f"http://127.0.0.1:{port}/page",
                                                "snippet": "Named after <b>Holmia</b>."}]}).encode()
                ctype = "application/json"
            else:
                body = b"<html><script>x()</script><p>Holmium is element 67.</p></html>"
                ctype = "text/html"
            self.send_response(200)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    srv = HTTPServer(("127.0.0.1", 0), H)
    port = srv.server_address[1]
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        monkeypatch.setenv("ATTNPROBE_SEARCH_PROVIDER", "generic")
        monkeypatch.setenv("ATTNPROBE_SEARCH_URL", f"http://127.0.0.1:{port}/search")
        s = HTTPSearch()
        res = s.search("holmium", 3)
        assert res[0].title == "Holmium" and res[0].snippet == "Named after Holmia."
        assert s.fetch(res[0].url) == "Holmium is element 67."
    finally:
        srv.shutdown()


def test_cli_exit_codes(tmp_path, monkeypatch):
    from attnprobe.cli.main import main

    monkeypatch.delenv("ATTNPROBE_SEARCH_KEY", raising=False)
    monkeypatch.delenv("ATTNPROBE_SEARCH_PROVIDER", raising=False)
    assert main(["run", str(QUESTIONS), "--search", "http", "--out", str(tmp_path / "x.jsonl")]) == 2
    bad = tmp_path / "q.jsonl"
    bad.write_text('{"id": "a"}\n')
    assert main(["run", str(bad), "--out", str(tmp_path / "y.jsonl")]) == 2
    with pytest.raises(SystemExit):
        main(["run", str(QUESTIONS), "--out", "z.jsonl", "--filter", "bogus"])


def test_settings_validation():
    with pytest.raises(ValueError):
        RunSettings(filter="nope")
    with pytest.raises(ValueError):
        RunSettings(validation="stage3")
    assert RunSettings.preset("baseline").filter == "none"


def test_chain_parsing_fallback():
    items = V.memory_items("task", [("search_worker('x')", "obs")])
    steps, parsed = V.parse_chain("I think it is fine.", items, "42")
    assert not parsed and steps[0].cites == ["T", "O1"]
    steps, parsed = V.parse_chain("**S1**: a (from: O1)\nS2: b [S1, O7]", items, "42")
    assert parsed and steps[0].cites == ["O1"] and steps[1].cites == ["S1"]  # unknown O7 dropped
    assert V.parse_verdict("INVALID: check the year")[0] == "invalid"
    assert V.parse_verdict("Valid.")[0] == "valid"
    assert F.decide(ChatReply(content="", tool_calls=[]), []).parsed is False


def test_resume_refuses_other_settings(tmp_path, bm25):
    out = tmp_path / "r.jsonl"
    run_questions(ScriptedChat(good_policy), one_question(), RunSettings.preset("nis-agent"), out, search=bm25)
    with pytest.raises(attnprobe.AttnprobeError, match="other settings"):
        run_questions(ScriptedChat(good_policy), one_question(), RunSettings.preset("nis-agent", worker_steps=1), out,
                      search=bm25, resume=True)


def test_visit_page_refuses_private_addresses(monkeypatch):
    """The model writes visit_page URLs: loopback, private, link-local and unresolvable hosts are never
    opened (issue 13), unless ATTNPROBE_ALLOW_PRIVATE_URLS=1."""
    from attnprobe.agents import search as S

    for url, kind in (("http://127.0.0.1:8000/x", "loopback"), ("http://localhost/", "loopback"),
                      ("http://10.1.2.3/", "private"), ("http://169.254.169.254/latest/meta-data", "link-local"),
                      ("http://[::1]/", "loopback"), ("http://0.0.0.0/", "unspecified")):
        assert kind in (S.private_address(url) or ""), url
    assert S.private_address("http://8.8.8.8/") is None
    monkeypatch.setenv("ATTNPROBE_SEARCH_PROVIDER", "generic")
    monkeypatch.setenv("ATTNPROBE_SEARCH_URL", "http://127.0.0.1:9/search")
    opened = []
    monkeypatch.setattr(S.urllib.request.OpenerDirector, "open", lambda self, *a, **k: opened.append(a))
    assert S.HTTPSearch().fetch("http://127.0.0.1:9/secret") is None and not opened
    monkeypatch.setenv("ATTNPROBE_ALLOW_PRIVATE_URLS", "1")
    with pytest.raises(TypeError):  # the fake opener returns None: the request did go out
        S.HTTPSearch().fetch("http://127.0.0.1:9/secret")
    assert opened
