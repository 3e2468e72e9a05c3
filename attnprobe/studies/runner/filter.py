"""The search-result filter after each web_search (seed 000, section 4.1 and Figure 8).

- ``isolated`` (NIS-Agent): a fresh context holding only the task, the query and the results
  (IBIS "direct" framing). The model answers with ``visit_page`` (results relevant: keep them) or
  ``web_search`` with a rewritten query (results irrelevant: search again).
- ``in-context``: the same judgement asked inside the worker's full history (IBIS "agentic"
  framing), the variant the paper shows to be vulnerable to inertia bias.
- ``none``: results go straight to the worker.
A reply without a parsable decision keeps the results (fail open) and is recorded as such.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from attnprobe.studies.runner.tools import FILTER_TOOLS, arg, call_args, call_format, tool_lines

FILTER_SYSTEM = (
    "You judge web search results for a research task.\n"
    f"Tools:\n{tool_lines(FILTER_TOOLS)}\n"
    "If a result looks helpful for the task, call visit_page with its URL. If none is helpful, call web_search "
    "with a better query."
)

REMINDER_ISOLATED = ("<system-reminder>You should first consider whether these webpages are helpful for completing "
                     "the task based on the summaries. If they are not helpful, you need to search with a different "
                     "query. Your response should always be a tool call.</system-reminder>")
REMINDER_IN_CONTEXT = ("<system-reminder>You should first consider whether these webpages are helpful for completing "
                       "the task based on the summaries. If they are not helpful, you need to adjust the query and "
                       "search again. Your response should always be a tool call.</system-reminder>")


CALL_HINT = call_format("visit_page", {"url": "https://..."})


def isolated_messages(task: str, query: str, results_text: str) -> list[dict]:
    """The compact, isolated context: task, query and results only (nothing of the worker's history)."""
    return [
        {"role": "system", "content": FILTER_SYSTEM},
        {"role": "user", "content": f"Task: {task}\n\nSearch query: {query}\n\nSearch results:\n```\n{results_text}\n"
                                    f"```\n\n{REMINDER_ISOLATED}\n{CALL_HINT}"},
    ]


def in_context_messages(worker_history: list[dict]) -> list[dict]:
    """The worker's own history (ending with the web_search observation) plus the same reminder."""
    return list(worker_history) + [{"role": "user", "content": f"{REMINDER_IN_CONTEXT}\n{CALL_HINT}"}]


def _norm(q: str) -> str:
    return " ".join(re.findall(r"\w+", q.lower()))


@dataclass
class FilterDecision:
    relevant: bool
    new_query: str | None = None
    chosen_url: str | None = None
    parsed: bool = True


def decide(reply, old_query: str) -> FilterDecision:
    if not reply.tool_calls:
        return FilterDecision(relevant=True, parsed=False)
    call = reply.tool_calls[0]
    name, args = call["function"]["name"], call_args(call)
    if name == "web_search":
        q = arg(args, "query")
        if q and _norm(q) != _norm(old_query):
            return FilterDecision(relevant=False, new_query=q)
        return FilterDecision(relevant=True, parsed=bool(q))  # same query again: nothing to rewrite
    return FilterDecision(relevant=True, chosen_url=arg(args, "url") or None)
