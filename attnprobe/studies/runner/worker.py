"""The search worker: web_search -> (filter decides what it sees) -> visit_page / find_in_page -> final_answer.

Under a context policy (``RunSettings.context_policy``) the worker keeps its history in a
:class:`attnprobe.agents.context.ContextHistory`: at each step it is sent the policy's view of it (the
in-context filter too, which is asked in the worker's context), a refiner runs once per round on that
round's observations, and each recorded call carries ``meta.history`` linking it to the full history.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from attnprobe.agents.context import ContextHistory
from attnprobe.agents.filter import (
    ask_query_messages,
    decide,
    filter_action,
    in_context_messages,
    isolated_messages,
    query_from_reply,
    same_query,
)
from attnprobe.agents.recorder import Recorder
from attnprobe.agents.tools import (
    FINAL_ANSWER,
    WORKER_TOOLS,
    ToolBox,
    arg,
    call_args,
    call_format,
    format_results,
    no_call_hint,
    out_of_steps,
    tool_lines,
)
from attnprobe.generation.chat import ActionFormat
from attnprobe.studies.runner.config import RunSettings

WORKER_SYSTEM = (
    "You are a search worker. Find the information the task asks for.\n"
    f"Tools:\n{tool_lines(WORKER_TOOLS)}\n"
    "Search, read the most relevant page, then call final_answer with what you found."
)
CALL_HINT = call_format("web_search", {"query": "keywords"})
NO_CALL_HINT = no_call_hint(CALL_HINT)
WORKER_OUT_OF_STEPS = out_of_steps("what you found", "what you found")
MAX_CALLS_PER_REPLY = 3  # ours: tool calls of one reply that are run (the rest are dropped)
# The observation after the filter still answers No once the last rewrite is spent (then the queries tried).
UNABLE_NOTE = "Unable to find a relevant result for this query; try a different approach."


def action_format(settings: RunSettings, scaffold: str, tools: list[dict]) -> ActionFormat | None:
    """The action grammar of a manager ("nis-manager") or worker ("nis-worker") call offering ``tools``, when
    the run constrains replies (``structured_actions``, default off); None: free decoding, as the seed."""
    if not settings.structured_actions:
        return None
    return ActionFormat(scaffold, json.dumps(tools, ensure_ascii=False), max_new_tokens=settings.max_new_tokens)


def agent_turn(rec: Recorder, agent: str, messages, tools: list[dict], meta: dict, no_call_hint: str, *,
               sent: list[dict] | None = None, actions: ActionFormat | None = None):
    """One step of an agent loop: call the model (recorded) with ``sent`` (default: ``messages``), append its
    reply to ``messages`` (a list or a :class:`ContextHistory`) and return (reply, tool calls). A reply
    without calls gets ``no_call_hint`` appended and no calls. ``actions``: see :func:`action_format`."""
    reply = rec.call(agent, messages if sent is None else sent, tools, extra_meta=meta, actions=actions)
    msg = reply.as_message()
    if not (msg.get("content") or "").strip() and not msg.get("tool_calls"):
        msg["content"] = "(empty reply)"
    if msg.get("tool_calls"):
        msg["tool_calls"] = msg["tool_calls"][:MAX_CALLS_PER_REPLY]
        if isinstance(messages, ContextHistory):
            msg["tool_calls"] = fresh_call_ids(messages.full, msg["tool_calls"])
    messages.append(msg)
    if not reply.tool_calls:
        messages.append({"role": "user", "content": no_call_hint})
        return reply, []
    return reply, msg["tool_calls"]


def fresh_call_ids(history: list[dict], calls: list[dict]) -> list[dict]:
    """``calls`` with ids unique in ``history``: a view that removed earlier calls (IRCoT-oq) lets a backend
    that numbers calls from its context reuse an id, which would make a later placeholder or refiner read
    the wrong call. Unique ids are kept as they are (so without a policy nothing changes); otherwise every
    call of the reply is renumbered ``call<n>``, on from the calls already in the history."""
    taken = {c.get("id") for m in history for c in m.get("tool_calls") or []}
    ids = [c.get("id") for c in calls]
    if all(ids) and len(set(ids)) == len(ids) and not taken & set(ids):
        return calls
    n, out = sum(len(m.get("tool_calls") or []) for m in history), []
    for c in calls:
        n += 1
        while f"call{n}" in taken:
            n += 1
        out.append({**c, "id": f"call{n}"})
    return out


@dataclass
class WorkerReport:
    report: str
    steps: int
    searches: int = 0
    rewrites: int = 0
    filter_calls: int = 0
    parse_failures: int = 0
    forced: bool = False
    visited: list[str] = field(default_factory=list)
    filter_decisions: dict[str, int] = field(default_factory=dict)  # kind -> count (FilterDecision.kind)
    replaced: int = 0         # observations that were not the worker's own raw results
    unable: int = 0           # observations replaced by UNABLE_NOTE
    filter_events: list[dict] = field(default_factory=list)
    history: ContextHistory | None = None  # the worker's full history under a context policy (None without)

    def summary(self) -> dict:
        out = {"report": self.report, "steps": self.steps, "searches": self.searches, "rewrites": self.rewrites,
               "filter_calls": self.filter_calls, "filter_decisions": dict(self.filter_decisions),
               "replaced": self.replaced, "unable": self.unable, "parse_failures": self.parse_failures,
               "forced": self.forced, "filter_events": self.filter_events}
        if self.history is not None:
            h = self.history
            out["context"] = {"policy": h.setting.spec, "history_id": h.id, "refiner_calls": h.refiner_calls,
                              "refined": sorted(h.refined), "acted_calls": h.acted_calls}
        return out


def unknown_tool(name: str, allowed: list[dict]) -> str:
    names = ", ".join(t["function"]["name"] for t in allowed)
    return f"Error: unknown tool {name!r}. Available tools: {names}."


def rewrite_note(old: str, new: str) -> str:
    return f"The result filter found no helpful result for {old!r} and searched again with {new!r}.\n"


def unable_observation(tried: list[str]) -> str:
    """What the worker sees when the filter still answers No after the last rewrite."""
    return UNABLE_NOTE + " Queries tried: " + ", ".join(repr(q) for q in tried) + "."


class SearchWorker:
    def __init__(self, rec: Recorder, toolbox: ToolBox, settings: RunSettings, index: int):
        self.rec, self.toolbox, self.settings, self.index = rec, toolbox, settings, index
        self.history = ContextHistory(settings.context_policy, f"{rec.run_id}/history-{index}")

    def _view(self, meta: dict) -> tuple[list[dict], dict]:
        """What the worker's context is now under the policy, and ``meta`` with its ``history`` link
        (only under a policy: without one the history is sent as it is and nothing is added)."""
        cf = self.history.view()
        if not self.history.setting.active:
            return cf.messages, meta
        link = self.history.link(cf)
        if link["changes"] or link["refined"]:  # the policy changed what this call is sent
            self.history.acted_calls += 1
        return cf.messages, {**meta, "history": link}

    def _ask_query(self, msgs: list[dict], reply_text: str, meta: dict) -> str | None:
        """A bare No: ask the same filter context for the rewritten query (recorded as a filter call)."""
        r = self.rec.call("filter", ask_query_messages(msgs, reply_text), None, extra_meta={**meta, "purpose": "rewrite"})
        return query_from_reply(r)

    def _filtered_search(self, task: str, query: str, info: WorkerReport,
                         call_id: str) -> tuple[str, dict | None]:
        """Run web_search and, unless the filter is off, let it decide what the worker sees.

        Sites chosen: only those results (formatted as web_search formats them). No: search again
        with the rewritten query, at most ``max_rewrites`` times; still No after that: UNABLE_NOTE.
        Unparseable: the results as they are (fail open). Returns (observation, event for the meta).
        """
        text, results = self.toolbox.web_search(query)
        info.searches += 1
        mode = self.settings.filter
        if mode == "none" or not query:
            return text, None
        original = text
        event: dict = {"mode": mode, "query": query, "rounds": [], "rewrites": [], "chosen_urls": [],
                       "outcome": "", "replaced": False}
        notes = ""
        current, tried = query, [query]
        for round_ in range(self.settings.max_rewrites + 1):
            meta = {"filter_mode": mode, "worker": self.index, "query": current, "round": round_}
            if mode == "isolated":
                msgs = isolated_messages(task, current, text)
            else:  # asked in the worker's context, as the worker sees it (the policy's view)
                seen, meta = self._view(meta)
                msgs = in_context_messages(seen + [{"role": "tool", "tool_call_id": call_id,
                                                    "content": notes + text}])
            reply = self.rec.call("filter", msgs, None, extra_meta=meta)
            info.filter_calls += 1
            d = decide(reply, results)
            info.filter_decisions[d.kind] = info.filter_decisions.get(d.kind, 0) + 1
            event["rounds"].append({"query": current, **d.to_dict(), "action": filter_action(d)})
            if not d.parsed or d.relevant:
                obs = notes + text
                if d.chosen_urls:
                    chosen = [r for u in d.chosen_urls for r in results if r.url == u]
                    self.toolbox.last_results = chosen
                    obs = notes + format_results(chosen)
                event["chosen_urls"] = list(d.chosen_urls)
                event["outcome"] = d.kind
                break
            if round_ == self.settings.max_rewrites:
                obs = unable_observation(tried)
                info.unable += 1
                event["outcome"] = "unable"
                break
            new = d.new_query if d.new_query and not any(same_query(d.new_query, q) for q in tried) else None
            if new is None:
                info.filter_calls += 1
                new = self._ask_query(msgs, reply.content or reply.raw_text, {**meta, "round": round_})
                if new is not None and any(same_query(new, q) for q in tried):
                    new = None
            if new is None:  # judged irrelevant and no new query to be had: nothing to show
                obs = unable_observation(tried)
                info.unable += 1
                event["outcome"] = "unable"
                event["no_query"] = True
                break
            info.rewrites += 1
            event["rewrites"].append(new)
            notes += rewrite_note(current, new)
            current = new
            tried.append(new)
            text, results = self.toolbox.web_search(current)
            info.searches += 1
        event["replaced"] = obs != original
        info.replaced += int(event["replaced"])
        event["tokens"] = {"original": self.rec.count_tokens(original), "shown": self.rec.count_tokens(obs)}
        event["chars"] = {"original": len(original), "shown": len(obs)}
        info.filter_events.append(event)
        return obs, event

    def run(self, task: str) -> WorkerReport:
        info = WorkerReport(report="", steps=0)
        if self.history.setting.active:
            info.history = self.history
        messages = self.history  # full history, refined copy and the view sent at each step
        messages.append({"role": "system", "content": WORKER_SYSTEM})
        messages.append({"role": "user", "content": f"Task: {task}\n\n{CALL_HINT}"})
        meta = {"worker": self.index, "worker_task": task}
        pending: list[dict] = []  # filter events the next recorded worker call has in its context

        def step_meta(step) -> dict:
            m = {**meta, "step": step, **({"filter": list(pending)} if pending else {})}
            pending.clear()
            return m

        for step in range(self.settings.worker_steps):
            info.steps += 1
            sent, m = self._view(step_meta(step))
            before = len(messages)
            reply, calls = agent_turn(self.rec, "search_worker", messages, WORKER_TOOLS, m, NO_CALL_HINT, sent=sent,
                                      actions=action_format(self.settings, "nis-worker", WORKER_TOOLS))
            messages.record_step(step, self.rec.last_call_id, before)
            if not calls:
                info.parse_failures += 1
                continue
            for call in calls:
                name, args = call["function"]["name"], call_args(call)
                if name == "final_answer":
                    info.report = arg(args, "answer") or reply.content or "(no report)"
                    return info
                if name == "web_search":
                    obs, event = self._filtered_search(task, arg(args, "query"), info, call["id"])
                    if event is not None:
                        pending.append({"call_id": call["id"], **event})
                elif name == "visit_page":
                    url = arg(args, "url")
                    info.visited.append(url)
                    obs = self.toolbox.visit_page(url)
                elif name == "find_in_page":
                    obs = self.toolbox.find_in_page(arg(args, "url"), str(args.get("pattern") or args.get("text")
                                                                           or args.get("query") or ""))
                else:
                    obs = unknown_tool(name, WORKER_TOOLS)
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": obs})
            # seed 004 §3.3: the round's observations are refined once, as they arrive (no refiner: nothing)
            messages.refine()
        info.forced = True
        messages.append({"role": "user", "content": WORKER_OUT_OF_STEPS})
        sent, m = self._view(step_meta("forced"))
        reply = self.rec.call("search_worker", sent, [FINAL_ANSWER], extra_meta=m,
                              actions=action_format(self.settings, "nis-worker", [FINAL_ANSWER]))
        messages.record_step("forced", self.rec.last_call_id)
        last = reply.as_message()  # the full history ends with the forced reply
        messages.append(last if (last.get("content") or "").strip() or last.get("tool_calls")
                        else {**last, "content": "(empty reply)"})
        if reply.tool_calls and reply.tool_calls[0]["function"]["name"] == "final_answer":
            info.report = arg(call_args(reply.tool_calls[0]), "answer")
        info.report = info.report or reply.content.strip() or _last_observation(messages.work) or "(no report)"
        return info


def _last_observation(messages: list[dict]) -> str:
    for m in reversed(messages):
        if m["role"] == "tool":
            return str(m.get("content") or "")[:600]
    return ""
