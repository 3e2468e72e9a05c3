"""Tool schemas (OpenAI format) and their execution against a search backend.

The tools only search and read text: nothing a model writes is ever executed as code, and
find_in_page matches its pattern literally.
"""

from __future__ import annotations

import json
from typing import Any

from attnprobe.agents.search import SearchBackend, SearchResult, find_lines
from attnprobe.trajectory.schema import call_arguments


def _fn(name: str, description: str, params: dict[str, tuple[str, str]]) -> dict:
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object",
                       "properties": {k: {"type": t, "description": d} for k, (t, d) in params.items()},
                       "required": list(params), "additionalProperties": False}}}


WEB_SEARCH = _fn("web_search", "Search the web; returns numbered results with titles, URLs and snippets.",
                 {"query": ("string", "A few search keywords.")})
VISIT_PAGE = _fn("visit_page", "Read a web page; returns its text.", {"url": ("string", "URL of a search result.")})
FIND_IN_PAGE = _fn("find_in_page", "Return only the sentences of a page that contain the given words.",
                   {"url": ("string", "URL of the page."), "pattern": ("string", "Words to look for.")})
FINAL_ANSWER = _fn("final_answer", "Give the final answer and stop.", {"answer": ("string", "The answer, brief.")})
SEARCH_WORKER = _fn("search_worker", "Delegate a search sub-task to the search worker; returns its report.",
                    {"task": ("string", "The sub-task: what to find out.")})

WORKER_TOOLS = [WEB_SEARCH, VISIT_PAGE, FIND_IN_PAGE, FINAL_ANSWER]
MANAGER_TOOLS = [SEARCH_WORKER, FINAL_ANSWER]
FILTER_TOOLS = [WEB_SEARCH, VISIT_PAGE]  # re-search (rewrite) vs keep the results and browse


def tool_lines(tools: list[dict]) -> str:
    lines = []
    for t in tools:
        fn = t["function"]
        args = ", ".join(fn["parameters"]["properties"])
        lines.append(f"- {fn['name']}({args}): {fn['description']}")
    return "\n".join(lines)


def call_format(example_name: str, example_args: dict) -> str:
    return "Reply with one tool call in JSON, for example " + json.dumps(
        {"name": example_name, "arguments": example_args}, ensure_ascii=False)


def call_args(call: dict) -> dict[str, Any]:
    """A model's call arguments as a dict; anything else (not JSON, not an object) is ``{}``."""
    return call_arguments(call, on_error="empty", dict_only=True)


def arg(args: dict, *names: str) -> str:
    """The first present argument among ``names`` (then 'input', then any string value)."""
    for n in (*names, "input"):
        v = args.get(n)
        if isinstance(v, (str, int, float)) and str(v).strip():
            return str(v).strip()
    for v in args.values():
        if isinstance(v, str) and v.strip():
            return v.strip()
    return ""


def format_results(results: list[SearchResult]) -> str:
    if not results:
        return "No results found."
    return "\n".join(f"{i}. [{r.title}]({r.url})\n{r.snippet}" for i, r in enumerate(results, 1))


class ToolBox:
    """Executes the worker's search tools; every method returns the observation text."""

    def __init__(self, search: SearchBackend, *, top_k: int = 4, page_chars: int = 1200):
        self.search_backend = search
        self.top_k = top_k
        self.page_chars = page_chars
        self.last_results: list[SearchResult] = []

    def web_search(self, query: str) -> tuple[str, list[SearchResult]]:
        if not query:
            return "Error: web_search needs a non-empty 'query'.", []
        results = self.search_backend.search(query, self.top_k)
        self.last_results = results
        return format_results(results), results

    def _resolve(self, url: str) -> str:
        url = url.strip().strip("<>()[]\"'")
        if url.isdigit() and 1 <= int(url) <= len(self.last_results):  # "visit result 2"
            return self.last_results[int(url) - 1].url
        return url

    def visit_page(self, url: str) -> str:
        if not url:
            return "Error: visit_page needs a 'url'."
        url = self._resolve(url)
        text = self.search_backend.fetch(url)
        if text is None:
            return f"Error: could not open {url}. Use a URL from the search results."
        return text if len(text) <= self.page_chars else text[: self.page_chars] + " ... [page cut]"

    def find_in_page(self, url: str, pattern: str) -> str:
        if not url or not pattern:
            return "Error: find_in_page needs 'url' and 'pattern'."
        url = self._resolve(url)
        text = self.search_backend.fetch(url)
        if text is None:
            return f"Error: could not open {url}. Use a URL from the search results."
        hits = find_lines(text, pattern)
        return "\n".join(f"- {h}" for h in hits) if hits else f"No sentence of {url} contains {pattern!r}."


def no_call_hint(call_hint: str) -> str:
    """What an agent is told after a reply without a tool call."""
    return "Error: your reply contained no tool call. " + call_hint


def out_of_steps(what: str, example: str) -> str:
    """The last-step instruction: answer now with ``what`` (``example`` shows the call format)."""
    return f"You have no steps left. Call final_answer now with {what}. " + call_format("final_answer", {"answer": example})
