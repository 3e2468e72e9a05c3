"""The search worker: web_search -> (filter) -> visit_page / find_in_page -> final_answer (its report)."""

from __future__ import annotations

from dataclasses import dataclass, field

from attnprobe.studies.runner.config import RunSettings
from attnprobe.studies.runner.filter import decide, in_context_messages, isolated_messages
from attnprobe.studies.runner.recorder import Recorder
from attnprobe.studies.runner.tools import (
    FILTER_TOOLS,
    FINAL_ANSWER,
    WORKER_TOOLS,
    ToolBox,
    arg,
    call_args,
    call_format,
    no_call_hint,
    out_of_steps,
    tool_lines,
)

WORKER_SYSTEM = (
    "You are a search worker. Find the information the task asks for.\n"
    f"Tools:\n{tool_lines(WORKER_TOOLS)}\n"
    "Search, read the most relevant page, then call final_answer with what you found."
)
CALL_HINT = call_format("web_search", {"query": "keywords"})
NO_CALL_HINT = no_call_hint(CALL_HINT)
WORKER_OUT_OF_STEPS = out_of_steps("what you found", "what you found")
MAX_CALLS_PER_REPLY = 3


def agent_turn(rec: Recorder, agent: str, messages: list[dict], tools: list[dict], meta: dict,
               no_call_hint: str):
    """One step of an agent loop: call the model (recorded), append its reply to ``messages`` and
    return (reply, tool calls). A reply without calls gets ``no_call_hint`` appended and no calls."""
    reply = rec.call(agent, messages, tools, extra_meta=meta)
    msg = reply.as_message()
    if not (msg.get("content") or "").strip() and not msg.get("tool_calls"):
        msg["content"] = "(empty reply)"
    if msg.get("tool_calls"):
        msg["tool_calls"] = msg["tool_calls"][:MAX_CALLS_PER_REPLY]
    messages.append(msg)
    if not reply.tool_calls:
        messages.append({"role": "user", "content": no_call_hint})
        return reply, []
    return reply, msg["tool_calls"]


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


def unknown_tool(name: str, allowed: list[dict]) -> str:
    names = ", ".join(t["function"]["name"] for t in allowed)
    return f"Error: unknown tool {name!r}. Available tools: {names}."


class SearchWorker:
    def __init__(self, rec: Recorder, toolbox: ToolBox, settings: RunSettings, index: int):
        self.rec, self.toolbox, self.settings, self.index = rec, toolbox, settings, index

    def _filtered_search(self, task: str, query: str, history: list[dict], info: WorkerReport, call_id: str) -> str:
        """Run web_search and, unless the filter is off, let it judge the results (and rewrite the query)."""
        text, _ = self.toolbox.web_search(query)
        info.searches += 1
        mode = self.settings.filter
        if mode == "none" or not query:
            return text
        note = ""
        current = query
        for round_ in range(self.settings.max_rewrites + 1):
            if mode == "isolated":
                msgs = isolated_messages(task, current, text)
            else:
                msgs = in_context_messages(history + [{"role": "tool", "tool_call_id": call_id,
                                                       "content": note + text}])
            reply = self.rec.call("filter", msgs, FILTER_TOOLS,
                                  extra_meta={"filter_mode": mode, "worker": self.index, "query": current,
                                              "round": round_})
            info.filter_calls += 1
            d = decide(reply, current)
            if d.relevant or round_ == self.settings.max_rewrites:
                if not d.relevant:
                    note += (f"The result filter judged the results for {current!r} irrelevant, but no rewrites "
                             "are left.\n")
                return note + text
            info.rewrites += 1
            note += f"The result filter judged the results for {current!r} irrelevant and searched again with " \
                    f"{d.new_query!r}.\n"
            current = d.new_query
            text, _ = self.toolbox.web_search(current)
            info.searches += 1
        return note + text

    def run(self, task: str) -> WorkerReport:
        info = WorkerReport(report="", steps=0)
        messages: list[dict] = [{"role": "system", "content": WORKER_SYSTEM}, {"role": "user", "content": f"Task: {task}\n\n{CALL_HINT}"}]
        meta = {"worker": self.index, "worker_task": task}
        for step in range(self.settings.worker_steps):
            info.steps += 1
            reply, calls = agent_turn(self.rec, "search_worker", messages, WORKER_TOOLS, {**meta, "step": step}, NO_CALL_HINT)
            if not calls:
                info.parse_failures += 1
                continue
            for call in calls:
                name, args = call["function"]["name"], call_args(call)
                if name == "final_answer":
                    info.report = arg(args, "answer") or reply.content or "(no report)"
                    return info
                if name == "web_search":
                    obs = self._filtered_search(task, arg(args, "query"), messages, info, call["id"])
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
        info.forced = True
        messages.append({"role": "user", "content": WORKER_OUT_OF_STEPS})
        reply = self.rec.call("search_worker", messages, [FINAL_ANSWER], extra_meta={**meta, "step": "forced"})
        if reply.tool_calls and reply.tool_calls[0]["function"]["name"] == "final_answer":
            info.report = arg(call_args(reply.tool_calls[0]), "answer")
        info.report = info.report or reply.content.strip() or _last_observation(messages) or "(no report)"
        return info


def _last_observation(messages: list[dict]) -> str:
    for m in reversed(messages):
        if m["role"] == "tool":
            return str(m.get("content") or "")[:600]
    return ""
