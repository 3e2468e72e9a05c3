"""Context policies in the NIS-Agent runner (``attnprobe run --context-policy``): exactly what the search
worker is sent at every step, the full history beside the calls, the refiner once per round, resume.

A scripted chat model (tests/support/scripted_chat.py) answers from what it is sent and a fixed search
backend returns known pages, so every expected message list is written out by hand.
"""

from __future__ import annotations

import hashlib
import json

import pytest
from support.fixed_search import FixedSearch as _FixedSearch
from support.scripted_chat import ScriptedChat, tool_call

import attnprobe
from attnprobe.agents import refiners
from attnprobe.generation.toolparse import call_ids
from attnprobe.studies.runner import RunSettings, run_questions
from attnprobe.studies.runner import validation as V
from attnprobe.studies.runner.worker import CALL_HINT, NO_CALL_HINT, WORKER_SYSTEM


class FixedSearch(_FixedSearch):
    """The shared fixed pages, page C with a third sentence (the refiner has something to drop)."""

    DOCS = {**_FixedSearch.DOCS, "u/c": ("C", "Gamma one. Answer is 42. Gamma three.")}


Q = [{"id": "t1", "question": "What is the answer?", "answers": ["42"], "type": None}]  # read_questions' form
SUB = "find the answer"
# the worker's replies, by how many of its own turns it has been shown (masking keeps every turn)
WORKER_PLAN = [[("web_search", {"query": "q1 first"})],
               [("visit_page", {"url": "u/a"}), ("find_in_page", {"url": "u/c", "pattern": "Answer"})],
               [("web_search", {"query": "q2 second"})],
               [("final_answer", {"answer": "42"})]]


def _calls(messages, plan):
    ids = call_ids(messages, len(plan))
    return [tool_call(i, name, **args) for i, (name, args) in zip(ids, plan)]


def script(messages, tools, plan=WORKER_PLAN):
    system = messages[0]["content"]
    if system.startswith("You are the manager"):
        done = any(m["role"] == "tool" for m in messages)
        plan = [("final_answer", {"answer": "42"})] if done else [("search_worker", {"task": SUB})]
        return "", _calls(messages, plan)
    if system == WORKER_SYSTEM:
        if "<system-reminder>" in str(messages[-1]["content"]):  # the in-context filter
            return "1"
        n = sum(m["role"] == "assistant" for m in messages)
        return f"thought {n}", _calls(messages, plan[min(n, 3)])
    if system == V.STAGE1_SYSTEM:
        return "S1: The answer is 42. (from: O1)"
    return "VALID"


def run(tmp_path, name="r", *, plan=WORKER_PLAN, fail_on_call=None, resume=False, **settings):
    out = tmp_path / f"{name}.jsonl"
    chat = ScriptedChat(lambda m, t: script(m, t, plan), fail_on_call=fail_on_call)
    res = run_questions(chat, Q, RunSettings.preset("baseline", worker_steps=4, **settings), out,
                        search=FixedSearch(), resume=resume)
    return chat, res, out


def _digest(out):
    calls = out.read_bytes()
    results = [{k: v for k, v in json.loads(x).items() if k != "seconds"}
               for x in out.with_suffix(".results.ndjson").read_text().splitlines()]
    for r in results:  # since issue 26 "gold" is the list of gold answers; the pin recorded the one string
        if isinstance(r.get("gold"), list) and len(r["gold"]) == 1:
            r["gold"] = r["gold"][0]
    return (hashlib.sha256(calls).hexdigest()[:16],
            hashlib.sha256(json.dumps(results, sort_keys=True).encode()).hexdigest()[:16])


# Recorded by the runner before context policies existed (commit 9fa85a3): the default (no policy) must
# keep writing these bytes.
PINNED = {"baseline": ("c62278a4e70405b5", "4a23c83c3e1c054a"),
          "in-context": ("13d886db45d2dc9e", "f6cc68f0963d2103")}


@pytest.mark.parametrize("case", list(PINNED))
def test_no_policy_records_what_the_runner_recorded_before(tmp_path, case):
    settings = {} if case == "baseline" else {"filter": "in-context", "validation": "full"}
    chat, res, out = run(tmp_path, **settings)
    assert res["results"][0]["answer"] == "42"
    assert _digest(out) == PINNED[case]
    assert not out.with_suffix(".history.jsonl").exists()


# ------------------------------------------------------------------ what the worker is sent, step by step
SYS = {"role": "system", "content": WORKER_SYSTEM}
TASK = {"role": "user", "content": f"Task: {SUB}\n\n{CALL_HINT}"}
A0 = {"role": "assistant", "content": "thought 0", "tool_calls": [tool_call("call1", "web_search", query="q1 first")]}
A1 = {"role": "assistant", "content": "thought 1",
      "tool_calls": [tool_call("call2", "visit_page", url="u/a"),
                     tool_call("call3", "find_in_page", url="u/c", pattern="Answer")]}
A3 = {"role": "assistant", "content": "thought 3", "tool_calls": [tool_call("call5", "final_answer", answer="42")]}


def A2(query="q2 second"):
    return {"role": "assistant", "content": "thought 2", "tool_calls": [tool_call("call4", "web_search", query=query)]}


def obs(cid, text):
    return {"role": "tool", "tool_call_id": cid, "content": text}


O1 = obs("call1", "1. [A](u/a)\nAlpha one\n2. [B](u/b)\nBeta one.")
O2 = obs("call2", "A\n\nAlpha one. Alpha two.")
O3 = obs("call3", "- Answer is 42.")
O4 = obs("call4", "1. [C](u/c)\nGamma one\n2. [B](u/b)\nBeta one.")
FULL = [SYS, TASK, A0, O1, A1, O2, O3, A2(), O4, A3]


def worker_calls(out):
    return [json.loads(x) for x in out.read_text().splitlines() if "/search_worker-" in json.loads(x)["id"]]


def test_mask_1_sends_placeholders_for_all_but_the_latest_observation(tmp_path):
    chat, res, out = run(tmp_path, context_policy="mask:1")
    # seed 002's released rule (issue 26): K = 1 counts turns with a non-error call, so at step 2 both parallel
    # observations of turn 1 stay and only turn 0's is archived; the placeholder is the release's text
    ph = {cid: obs(cid, f"[Auto-archived browser result] tool={t} | args: {a}") for cid, t, a in [
        ("call1", "web_search", "query='q1 first'"), ("call2", "visit_page", "url='u/a'"),
        ("call3", "find_in_page", "url='u/c', pattern='Answer'")]}
    expected = [[SYS, TASK],
                [SYS, TASK, A0, O1],
                [SYS, TASK, A0, ph["call1"], A1, O2, O3],
                [SYS, TASK, A0, ph["call1"], A1, ph["call2"], ph["call3"], A2(), O4]]
    sent = [m for m in chat.sent if m[0] == SYS]
    assert sent == expected
    calls = worker_calls(out)
    assert [c["messages"][:-1] for c in calls] == expected  # each recorded call is exactly what was sent
    assert [c["meta"]["history"] for c in calls] == [
        {"id": "baseline-t1/history-1", "messages": 2, "source": [0, 1], "changes": {}, "refined": []},
        {"id": "baseline-t1/history-1", "messages": 4, "source": [0, 1, 2, 3], "changes": {}, "refined": []},
        {"id": "baseline-t1/history-1", "messages": 7, "source": list(range(7)),
         "changes": {"3": "placeholder"}, "refined": []},
        {"id": "baseline-t1/history-1", "messages": 9, "source": list(range(9)),
         "changes": {"3": "placeholder", "5": "placeholder", "6": "placeholder"}, "refined": []}]
    # the run's settings say which masking rule and placeholder it used (issue 26)
    assert calls[0]["meta"]["settings"]["context_rules"]["mask:1"]["placeholder"] == (
        "[Auto-archived browser result] tool=<name> | args: <k=repr(v)[:80], ...>")
    summary = json.loads(out.with_suffix(".summary.json").read_text())
    assert "tools/context_management.py" in summary["settings"]["context_rules"]["mask:1"]["rule"]
    assert all(c["meta"]["settings"]["context_policy"] == "mask:1" for c in calls)
    # the manager is not masked (its calls carry no history link) and sees the same report as without a policy
    manager = [json.loads(x) for x in out.read_text().splitlines() if "/manager-" in json.loads(x)["id"]]
    assert len(manager) == 2 and all("history" not in c["meta"] for c in manager)
    assert manager[1]["messages"][3] == obs("call1", "42")
    # the full history beside the calls: nothing masked; each step's message count matches its call's link
    hist = [json.loads(x) for x in out.with_suffix(".history.jsonl").read_text().splitlines()]
    assert len(hist) == 1 and hist[0]["id"] == "baseline-t1/history-1" and hist[0]["messages"] == FULL
    assert hist[0]["meta"]["steps"] == [{"step": k, "call_id": f"baseline-t1/search_worker-{k + 1}", "messages": n}
                                        for k, n in enumerate([2, 4, 7, 9])]
    for c in calls:  # every message sent is its full-history message, or that message's placeholder
        link = c["meta"]["history"]
        for m, i in zip(c["messages"][:-1], link["source"]):
            assert m == (ph[FULL[i]["tool_call_id"]] if str(i) in link["changes"] else FULL[i])
    assert res["results"][0]["workers"][0]["context"] == {"policy": "mask:1", "history_id": "baseline-t1/history-1",
                                                          "refiner_calls": 0, "refined": [],
                                                          "acted_calls": 2}
    for traj in attnprobe.load_trajectories(out) + attnprobe.load_trajectories(out.with_suffix(".history.jsonl")):
        assert traj.framing == "trace"  # both files load as trajectories, unchanged


def test_refiner_runs_once_per_round_with_that_rounds_query(tmp_path, monkeypatch):
    seen = []
    real = refiners.bm25_refiner

    def counting(keep):
        f = real(keep)

        def refine(query, document):
            seen.append((query, document))
            return f(query, document)
        return refine

    monkeypatch.setattr(refiners, "bm25_refiner", counting)
    plan = [*WORKER_PLAN[:2], [("web_search", {"query": "q2 beta"})], WORKER_PLAN[3]]
    chat, res, out = run(tmp_path, plan=plan, context_policy="refine:bm25:3")
    # one refiner run per round, on that round's observations only, with that round's query (the call's
    # query argument, else its arguments and the turn's thought); the final turn has no later step
    assert seen == [("q1 first", O1["content"]), ("u/a thought 1", O2["content"]),
                    ("u/c Answer thought 1", O3["content"]), ("q2 beta", O4["content"])]
    # BM25 keeps the 3 best sentences in their order: no query word in O1 -> the first three; O2 has three;
    # O3 has one (unchanged, so not refined); in O4 'Beta one.' matches 'beta' and displaces '2. [B](u/b)'
    r1 = obs("call1", "1. [A](u/a)\nAlpha one\n2. [B](u/b)")
    r2 = obs("call2", "A\nAlpha one.\nAlpha two.")
    r4 = obs("call4", "1. [C](u/c)\nGamma one\nBeta one.")
    expected = [[SYS, TASK],
                [SYS, TASK, A0, r1],
                [SYS, TASK, A0, r1, A1, r2, O3],
                [SYS, TASK, A0, r1, A1, r2, O3, A2("q2 beta"), r4]]
    assert [m for m in chat.sent if m[0] == SYS] == expected
    calls = worker_calls(out)
    assert [c["messages"][:-1] for c in calls] == expected
    assert [c["meta"]["history"]["refined"] for c in calls] == [[], [3], [3, 5], [3, 5, 8]]
    assert all(c["meta"]["history"]["changes"] == {} for c in calls)  # a refiner is not a view
    hist = json.loads(out.with_suffix(".history.jsonl").read_text())
    assert hist["messages"] == [SYS, TASK, A0, O1, A1, O2, O3, A2("q2 beta"), O4, A3]  # the documents as retrieved
    assert hist["meta"]["refined"] == {"3": r1["content"], "5": r2["content"], "8": r4["content"]}
    assert hist["meta"]["refiner_calls"] == 3
    assert res["results"][0]["workers"][0]["context"]["refiner_calls"] == 3


def test_composed_policy_masks_the_refined_history(tmp_path):
    _, _, a = run(tmp_path, "a", context_policy="mask:1+refine:bm25:3")
    _, _, b = run(tmp_path, "b", context_policy="refine:bm25:3+mask:1")
    sent = [c["messages"][:-1] for c in worker_calls(a)]
    assert sent == [c["messages"][:-1] for c in worker_calls(b)]  # the order of the parts does not matter
    assert sent[3][3]["content"].startswith("[Auto-archived browser result]") and sent[3][8]["content"] == (
        "1. [C](u/c)\nGamma one\n2. [B](u/b)")  # the latest observation, refined; older ones masked
    assert worker_calls(a)[3]["meta"]["history"]["refined"] == [3, 5, 8]


def test_a_view_that_removes_calls_does_not_let_call_ids_repeat(tmp_path):
    chat, res, out = run(tmp_path, context_policy="ircot:oq")
    hist = json.loads(out.with_suffix(".history.jsonl").read_text())
    ids = [c["id"] for m in hist["messages"] for c in m.get("tool_calls") or []]
    assert len(ids) == len(set(ids)) == 5
    # seed 004 IRCoT-oq at the last step: earlier turns keep their thoughts without their calls, and only the
    # latest observation is sent
    last = worker_calls(out)[3]["messages"][:-1]
    assert [m["role"] for m in last] == ["system", "user", "assistant", "assistant", "assistant", "tool"]
    assert [m.get("tool_calls") is None for m in last[2:5]] == [True, True, False]
    assert worker_calls(out)[3]["meta"]["history"]["changes"] == {"2": "calls_removed", "3": "removed",
                                                                  "4": "calls_removed", "5": "removed",
                                                                  "6": "removed"}


def test_ircot_keeps_the_latest_round_after_a_reply_with_no_call(tmp_path):
    """The worker's no-call hint is an invalid turn's feedback: it belongs to the round in progress, so the
    next call under IRCoT-o/oqp still sees the latest search's observation (DESIGN.md §10, rounds)."""
    plan = [[("web_search", {"query": "q1 first"})], [], [("web_search", {"query": "q2 second"})],
            [("final_answer", {"answer": "42"})]]
    for policy, roles in (("ircot:o", ["system", "user", "assistant", "tool", "assistant", "user"]),
                          ("ircot:oqp", ["system", "user", "assistant", "tool", "assistant", "user"])):
        _, _, out = run(tmp_path, policy.replace(":", "-"), plan=plan, context_policy=policy)
        third = worker_calls(out)[2]["messages"][:-1]
        assert [m["role"] for m in third] == roles
        assert third[3]["role"] == "tool" and third[3]["content"] == worker_calls(out)[1]["messages"][3]["content"]
        assert third[5]["content"] == NO_CALL_HINT
        fourth = worker_calls(out)[3]["messages"][:-1]
        n_tool = sum(m["role"] == "tool" for m in fourth)
        assert n_tool == 1  # only q2's observation: q1's round is no longer the latest
        assert [m["role"] for m in fourth] == (["system", "user", "assistant", "assistant", "user", "assistant", "tool"]
                                               if policy == "ircot:o" else ["system", "user", "assistant", "tool"])


# ------------------------------------------------------------------ resume
def test_resume_with_the_same_policy_gives_the_uninterrupted_records(tmp_path):
    _, _, ref = run(tmp_path, "ref", context_policy="mask:1+refine:bm25:3")
    with pytest.raises(RuntimeError, match="scripted interruption"):
        run(tmp_path, fail_on_call=4, context_policy="mask:1+refine:bm25:3")
    chat, res, out = run(tmp_path, resume=True, context_policy="mask:1+refine:bm25:3")
    assert res["results"][0]["replayed_calls"] == 3 and len(chat.sent) == 3
    assert out.read_text() == ref.read_text()
    assert out.with_suffix(".history.jsonl").read_text() == ref.with_suffix(".history.jsonl").read_text()


def test_resume_with_another_policy_is_refused_in_one_located_line(tmp_path):
    run(tmp_path, context_policy="mask:1")
    with pytest.raises(attnprobe.AttnprobeError) as err:
        run(tmp_path, resume=True)
    assert str(err.value) == (f"{tmp_path / 'r.results.ndjson'}, line 1: run baseline-t1 was made with other "
                              "settings (context_policy: 'mask:1' there, 'none' now); resume with the same options, "
                              "use --force to redo or another --out")
    # an interrupted run (calls recorded, no result yet) is refused too, at its first call
    with pytest.raises(RuntimeError):
        run(tmp_path, "p", fail_on_call=3)
    with pytest.raises(attnprobe.AttnprobeError, match=r"p\.jsonl, line 1: call baseline-t1/manager-1 was made "
                                                       r"with other settings \(context_policy: 'none' there, "
                                                       r"'refine:bm25:3' now\)"):
        run(tmp_path, "p", resume=True, context_policy="refine:bm25:3")


def test_cli_refuses_another_policy_on_resume_before_loading_a_model(tmp_path, monkeypatch, capsys):
    from attnprobe.cli import run as cli_run
    from attnprobe.cli.main import main

    run(tmp_path, context_policy="mask:1")
    qfile = tmp_path / "q.jsonl"
    qfile.write_text(json.dumps(Q[0]) + "\n")
    monkeypatch.setattr(cli_run, "make_chat", lambda args: pytest.fail("a model was loaded"))
    argv = ["run", str(qfile), "--preset", "baseline", "--worker-steps", "4", "--out", str(tmp_path / "r.jsonl"),
            "--no-progress"]
    refused = (f"attnprobe: error: {tmp_path / 'r.results.ndjson'}, line 1: run baseline-t1 was made with "
               "other settings (name: 'baseline' there, 'baseline_mask-2_refine-bm25-3' now; context_policy: 'mask:1' there, 'mask:2+refine:bm25:3' now); resume with the "
               "same options, use --force to redo or another --out")
    # a plain rerun resumes (issue 28), so it is refused the same way; --resume adds one deprecation line
    assert main(argv + ["--context-policy", "mask:2+refine:bm25:3"]) == 2
    assert capsys.readouterr().err.strip() == refused
    assert main(argv + ["--context-policy", "mask:2+refine:bm25:3", "--resume"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "attnprobe: --resume is deprecated: a run continues OUT by default (--force starts again)", refused]
    assert main(argv + ["--context-policy", "mask:x", "--force"]) == 2
    assert capsys.readouterr().err.strip() == ("attnprobe: error: --context-policy 'mask:x': K must be an integer, "
                                               "e.g. mask:5")


def test_in_context_filter_is_asked_in_the_worker_context_as_the_worker_sees_it(tmp_path):
    from attnprobe.agents.filter import REMINDER_IN_CONTEXT

    chat, res, out = run(tmp_path, filter="in-context", context_policy="mask:1")
    filters = [json.loads(x) for x in out.read_text().splitlines() if "/filter-" in json.loads(x)["id"]]
    assert len(filters) == 2
    ph = [obs(f"call{i}", f"[Auto-archived browser result] tool={t} | args: {a}") for i, t, a in [
        (1, "web_search", "query='q1 first'"), (2, "visit_page", "url='u/a'"),
        (3, "find_in_page", "url='u/c', pattern='Answer'")]]
    # the second search: the worker's history under mask:1, then the new results and the reminder. The new
    # search's turn (message 7) already counts, as in the release (its call is not an error), so turn 1's
    # observations are archived: the filter sees what the worker's next step would see
    assert filters[1]["messages"][:-1] == [SYS, TASK, A0, *ph[:1], A1, *ph[1:], A2(), O4,
                                           {"role": "user", "content": REMINDER_IN_CONTEXT}]
    assert filters[1]["meta"]["history"] == {"id": "baseline-t1/history-1", "messages": 8, "source": list(range(8)),
                                             "changes": {"3": "placeholder", "5": "placeholder",
                                                         "6": "placeholder"}, "refined": []}
    # the filter chose result 1, so the worker sees only it
    assert worker_calls(out)[3]["messages"][8] == obs("call4", "1. [C](u/c)\nGamma one")
