"""Behaviour: generate the model's next action for every framing and parse it.

Generation (greedy, temperature 0) goes through one chat backend from
:func:`attnprobe.generation.factory.open_backend`, wrapped by :class:`BehaviourBackend`:

- in process (:class:`~attnprobe.generation.transformers_chat.TransformersChat`): the prompt is
  rendered exactly as capture renders it. ``complete_many`` generates several framings in one
  left-padded batch (what ``run_behaviour`` uses with ``batch_size > 1``; several times faster on
  CPU); both it and ``complete`` stop a reply once it holds a complete tool call (greedy decoding
  makes the result a prefix of the full generation, so the parsed action is the same; this is what
  makes the paper's 4096-token limit affordable). It also records a secondary *forced choice*: the
  log-probability of ``{"name": "web_search"`` vs ``{"name": "visit_page"`` after the prompt, and, for
  the agentic framing, the same with the model's own earlier call renamed (the copy control).
- any OpenAI-compatible endpoint (``vllm serve``, ``attnprobe serve``) through
  :class:`~attnprobe.generation.openai_chat.OpenAIChat`; structured tool calls from the server count.

Two readouts of every reply (docs/methods.md):

- **primary, call-only** (:func:`classify_call`; ``decision``/``method``/``correct`` in a record):
  the tool the reply *calls*, as seed 000 Table 7 scores it ("calling the web_search tool is
  considered correct"): structured tool calls, then every tool-call syntax
  :mod:`attnprobe.generation.toolparse` knows (Hermes/Qwen ``<tool_call>``, Llama-3 JSON, smolagents
  ``Calling tools:``, Mistral ``[TOOL_CALLS]``, fenced JSON, Python-call style), alias names included.
  Under the paper protocol the direct framing is the NIS-Agent filter prompt, read by the filter's
  own parser ("No" -> web_search, chosen sites -> visit_page).
- **secondary, prose** (:func:`classify_reply`; ``decision_prose``/``method_prose``/
  ``correct_prose``): the same, then plain text (a tool named in prose, or an explicit intent phrase)
  after removing sentences copied verbatim from the prompt (small models often echo the reminder); a
  tool named under a negation ("I should not use visit_page") is no decision. Labelled secondary: only
  the agentic framing carries an in-context call, so prose credit differs by framing.

Anything else is ``unparseable``: counted, reported and scored as incorrect (the paper's rule: a
malformed action is an error), never dropped; the unparseable rate, the accuracy over parseable
replies and the gap over items parseable in both framings are reported beside it.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from attnprobe.generation.toolparse import parse_tool_calls
from attnprobe.generation.transformers_chat import TransformersChat
from attnprobe.io.settings import RECORDED_GENERATION_LIMIT
from attnprobe.studies.ibis.framings import COPY_CONTROL_TOOL, TOOL_NAMES, IbisProtocol, as_protocol, build_framing
from attnprobe.studies.ibis.items import IbisItem
from attnprobe.studies.ibis.layout import DECISIONS_FILE, ModelFolderLayout
from attnprobe.trajectory.schema import call_arguments

DECISIONS = ("web_search", "visit_page", "answer", "unparseable")
ALIASES = {
    "web_search": "web_search", "search": "web_search", "google_search": "web_search", "search_web": "web_search",
    "websearch": "web_search", "bing_search": "web_search", "duckduckgo_search": "web_search",
    "search_again": "web_search", "new_search": "web_search",
    "visit_page": "visit_page", "visit": "visit_page", "visit_webpage": "visit_page", "open_page": "visit_page",
    "open_url": "visit_page", "browse": "visit_page", "browse_page": "visit_page", "fetch_html": "visit_page",
    "fetch_page": "visit_page", "fetch_url": "visit_page", "open_result": "visit_page", "click": "visit_page",
    "final_answer": "answer", "answer": "answer", "return_answer": "answer",
}
_SEARCH_INTENT = re.compile(
    r"\b(search(ing)? (again|once more|anew|with (a|another|a different|a new|a better))|re-?search|"
    r"(new|different|another|better|refined|revised) (search|query)|refine (the|my) (search|query)|"
    r"rephrase (the|my) query|adjust (the|my) query)\b", re.I)
_VISIT_INTENT = re.compile(
    r"\b(visit|open|browse|click( on)?|read)\b[^.\n]{0,40}\b(page|result|link|url|website|site|article|"
    r"https?://\S+)", re.I)
FORCED_CHOICE_PREFIX = '{"name": "'
CALL_METHODS = ("tool_call", "parsed", "parsed-alias")  # what the primary, call-only readout accepts
# In process: a reply that has written this many tokens without opening a call is stopped (ours, not
# the seeds': with seed 000's 4096-token limit one such reply held a CPU batch for 46 minutes; a model
# that thinks inside <think> is not stopped). None = off, the seed's rule exactly (docs/ibis.md).
DEFAULT_NO_CALL_TOKENS = 1024
# The paper's limit for non-reasoning models (seed 000, C.3: "we limit the output token size to 4096");
# thinking models need it too. In process, generation stops as soon as a complete call is written, so
# the limit costs nothing for a model that answers with a call (docs/ibis.md, "max new tokens").
DEFAULT_MAX_NEW_TOKENS = 4096
_ANSWER_INTENT = re.compile(r"\b(final answer|the answer is)\b", re.I)


def _normalise_name(name: str) -> str | None:
    return ALIASES.get(re.sub(r"[^a-z_]", "", name.lower().replace("-", "_").replace(" ", "_")))


def _strip_echo(text: str, prompt: str) -> str:
    """Remove sentences/lines of ``text`` that appear verbatim in the prompt (echoed instructions)."""
    pieces = re.split(r"(?<=[.!?])\s+|\n+", text)
    kept = [p for p in pieces if not (len(p.strip()) >= 12 and p.strip() in prompt)]
    return "\n".join(kept)


def classify_call(raw_text: str, tool_calls: Iterable[dict] | None = None) -> dict[str, Any]:
    """The primary, call-only readout: {"decision", "method", "name", "arguments"} from the reply's
    tool call (structured or written in any syntax toolparse reads); no call -> ``unparseable``,
    method ``none``. Prose is never read here (see :func:`classify_reply`)."""
    return classify_reply(raw_text, tool_calls, prose=False)


def classify_reply(raw_text: str, tool_calls: Iterable[dict] | None = None, prompt_text: str = "", *,
                   prose: bool = True) -> dict[str, Any]:
    """{"decision", "method", "name", "arguments"} for one reply (see module docstring); with
    ``prose=False`` only calls count (:func:`classify_call`)."""
    for call in tool_calls or []:
        fn = call.get("function") or {}
        dec = _normalise_name(str(fn.get("name", "")))
        if dec:
            args = call_arguments(call, on_error="raw") if fn.get("arguments") is not None else {}
            return {"decision": dec, "method": "tool_call", "name": fn.get("name"), "arguments": args or {}}
    _, calls = parse_tool_calls(raw_text, None)
    for c in calls:
        dec = _normalise_name(c.name)
        if dec:
            return {"decision": dec, "method": "parsed" if c.name in TOOL_NAMES else "parsed-alias",
                    "name": c.name, "arguments": c.arguments}
    # Python-call style with an alias name (toolparse only accepts known names there).
    _, calls = parse_tool_calls(raw_text, sorted(ALIASES))
    for c in calls:
        dec = _normalise_name(c.name)
        if dec:
            return {"decision": dec, "method": "parsed" if c.name in TOOL_NAMES else "parsed-alias",
                    "name": c.name, "arguments": c.arguments}
    if not prose:
        return {"decision": "unparseable", "method": "none", "name": None, "arguments": {}}
    text = _strip_echo(raw_text, prompt_text) if prompt_text else raw_text
    mentions = {d: _mentions(text, re.compile(rf"\b{d}\b")) for d in ("web_search", "visit_page")}
    mentioned = {d for d, m in mentions.items() if m["affirmed"]}
    negated = any(m["negated"] for m in mentions.values())
    if len(mentioned) == 1:
        return {"decision": mentioned.pop(), "method": "name-mention", "name": None, "arguments": {}}
    if not mentioned and not any(m["negated"] and m["affirmed"] for m in mentions.values()):
        intents = {d: _mentions(text, rx) for d, rx in (("web_search", _SEARCH_INTENT), ("visit_page", _VISIT_INTENT),
                                                        ("answer", _ANSWER_INTENT))}
        hits = {d for d, m in intents.items() if m["affirmed"]}
        negated = negated or any(m["negated"] for m in intents.values())
        if len(hits) == 1 and not any(m["negated"] for m in mentions.values()):
            return {"decision": hits.pop(), "method": "intent", "name": None, "arguments": {}}
    # a tool named only under a negation ("I should not use visit_page") is no decision
    return {"decision": "unparseable", "method": "negated" if negated and not mentioned else "none", "name": None,
            "arguments": {}}


_NEGATION = re.compile(r"\b(not|never|no need to|avoid|avoiding|instead of|rather than|without|cannot)\b|n't\b", re.I)


def _mentions(text: str, rx: re.Pattern) -> dict[str, int]:
    """How often ``rx`` matches ``text`` affirmed vs under a negation: a negation cue earlier in the
    same clause (up to 6 words before the match, not across , . ; : ! ? "but" or "so")."""
    out = {"affirmed": 0, "negated": 0}
    for m in rx.finditer(text):
        clause = re.split(r"[.,;:!?\n]|\bbut\b|\bso\b", text[:m.start()], flags=re.I)[-1]
        window = " ".join(clause.split()[-6:])
        out["negated" if _NEGATION.search(window) else "affirmed"] += 1
    return out


def api_messages(messages: list[dict]) -> list[dict]:
    """Messages as an OpenAI-compatible server expects them (attnprobe-only keys removed)."""
    out = []
    for m in messages:
        m = {k: v for k, v in m.items() if k not in ("annotations", "author")}
        if m.get("role") == "assistant" and not m.get("content"):
            m["content"] = None if m.get("tool_calls") else ""
        out.append(m)
    return out


_FINISH = {"eos": "stop", "length": "length", "no_call": "no_call"}  # anything else: stopped at a complete call


def _ibis_meta(trajectory) -> dict:
    return (trajectory.meta or {}).get("ibis", {})


def forced_choice_applies(trajectory) -> bool:
    """The forced choice reads the option after ``{"name": "``: the call format of the IBIS system
    prompt. The paper protocol's direct framing is the filter prompt, answered "No" or with sites, where
    that prefix means nothing: no forced choice there (docs/ibis.md)."""
    meta = _ibis_meta(trajectory)
    return not (meta.get("protocol") == "paper" and meta.get("framing") == "direct")


def copy_control_framing(item: IbisItem, framing: str, protocol: IbisProtocol | str):
    """The agentic framing with its own earlier call renamed to :data:`COPY_CONTROL_TOOL` (None for
    other framings): the forced choice's copy control. The option names then no longer appear in the
    call the model made itself, only in the system prompt and tool list that every framing shares."""
    if framing != "agentic":
        return None
    return build_framing(item, "agentic", protocol, own_tool=COPY_CONTROL_TOOL)


class BehaviourBackend:
    """What IBIS needs on top of one chat backend (see module docstring): a reply for a framing's
    trajectory as a dict with the prompt text for echo stripping and the rendering name, and, in
    process, the forced choice. ``early_stop`` and ``forced_choice`` apply to in-process chats only."""

    def __init__(self, chat, *, early_stop: bool = True, forced_choice: bool = True,
                 no_call_tokens: int | None = DEFAULT_NO_CALL_TOKENS):
        self.in_process = isinstance(chat, TransformersChat)
        self.no_call_tokens = no_call_tokens if self.in_process else None
        if self.in_process:
            # stop a row once its text holds a complete call of any known tool name, or once it has
            # written no_call_tokens tokens without opening one
            chat = chat.configured(stop_at_call=early_stop, stop_names=tuple(ALIASES), stop_check_every=1,
                                   no_call_tokens=no_call_tokens)
        self.chat = chat
        self.kind = chat.kind
        self.name = chat.name
        self.forced_choice = forced_choice and self.in_process
        self.supports_batch = self.in_process
        self.tokenizer = chat.tokenizer if self.in_process else None

    def option_logprobs(self, prompt_ids) -> dict[str, float]:
        """Forced choice: summed log-probability of each tool name after the prompt + ``{"name": "``.

        The options differ only in the tool name (the call format the system prompt asks for), so
        the difference is the model's preference between the two actions; it exists for every
        item, even when the generated reply is unparseable."""
        return self.chat.option_logprobs(prompt_ids, ("web_search", "visit_page"), prefix=FORCED_CHOICE_PREFIX,
                                         suffix='"')

    @staticmethod
    def _fc_entry(lp: dict[str, float]) -> dict[str, Any]:
        ws, vp = lp["web_search"], lp["visit_page"]
        return {"logprob_web_search": round(ws, 5), "logprob_visit_page": round(vp, 5),
                "log_odds_visit": round(vp - ws, 5), "choice": "visit_page" if vp > ws else "web_search"}

    def _in_process_out(self, reply, finish: str, trajectory, control) -> dict[str, Any]:
        # the in-process model has no structured calls: its raw text is classified
        out = {"raw_text": reply.raw_text, "tool_calls": [], "input_tokens": reply.input_tokens,
               "output_tokens": reply.output_tokens, "finish_reason": finish, "prompt_text": reply.prompt.text,
               "rendering": reply.prompt.rendering}
        if self.forced_choice and forced_choice_applies(trajectory):
            out["forced_choice"] = self._fc_entry(self.option_logprobs(reply.prompt.ids))
            if control is not None:
                ids = self.chat.prompt(control.messages, control.tools).ids
                out["forced_choice_control"] = {**self._fc_entry(self.option_logprobs(ids)),
                                                "own_tool": COPY_CONTROL_TOOL}
        return out

    def complete_many(self, trajectories, *, max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS, controls=None,
                      on_progress=None) -> list[dict[str, Any]]:
        """Greedy generation for several framings in one left-padded batch (in process only);
        ``controls[i]`` is the copy-control trajectory of ``trajectories[i]`` (or None);
        ``on_progress(new_tokens, rows_stopped, rows)`` is called as the batch goes on."""
        controls = controls or [None] * len(trajectories)
        replies = self.chat.complete_many([(t.messages, t.tools) for t in trajectories], max_new_tokens=max_new_tokens,
                                          on_progress=on_progress)
        return [self._in_process_out(r, _FINISH.get(r.stopped_by, "call_complete"), t, c)
                for r, t, c in zip(replies, trajectories, controls)]

    def complete(self, trajectory, *, max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS, control=None,
                 on_progress=None) -> dict[str, Any]:
        if self.in_process:
            reply = self.chat.complete(trajectory.messages, trajectory.tools, max_new_tokens=max_new_tokens, temperature=0.0,
                                       on_progress=on_progress)
            return self._in_process_out(reply, _FINISH.get(reply.stopped_by, "call_complete"), trajectory, control)
        reply = self.chat.complete(api_messages(trajectory.messages), trajectory.tools, max_new_tokens=max_new_tokens,
                                   temperature=0.0)
        # The structured calls a server returns are authoritative; raw text is kept for the record.
        prompt_text = "\n".join(m.get("content") or "" for m in trajectory.messages if isinstance(m.get("content"), str))
        return {"raw_text": reply.raw_text or reply.content or "", "tool_calls": reply.tool_calls,
                "input_tokens": reply.input_tokens, "output_tokens": reply.output_tokens,
                "finish_reason": reply.finish_reason, "prompt_text": prompt_text, "rendering": "server"}


def decide(backend, item: IbisItem, framing: str, *, max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
           protocol: IbisProtocol | str = "paper", on_progress=None) -> dict[str, Any]:
    """Run one framing of one item and return its decision record (a decisions.jsonl line)."""
    protocol = as_protocol(protocol)
    traj = build_framing(item, framing, protocol)
    t0 = time.perf_counter()
    kw = {"on_progress": on_progress} if on_progress is not None else {}
    out = backend.complete(traj, max_new_tokens=max_new_tokens,
                           control=copy_control_framing(item, framing, protocol), **kw)
    return _record(backend, item, framing, out, time.perf_counter() - t0, max_new_tokens, protocol)


def classify_filter_reply(item: IbisItem, out: dict) -> dict[str, Any]:
    """The paper protocol's direct framing is the NIS-Agent filter prompt: its reply ("No" [+ query] or
    1-2 of the results' sites, or a call) is read by the runner's own parser and mapped No -> web_search,
    sites -> visit_page (seed 000 B.1: direct mode = the context-isolated filter module)."""
    from types import SimpleNamespace

    from attnprobe.agents.filter import decide, filter_action

    reply = SimpleNamespace(tool_calls=out["tool_calls"], content=out["raw_text"], raw_text=out["raw_text"])
    fd = decide(reply, item.results)
    return {"decision": filter_action(fd), "method": f"filter-{fd.kind}", "name": None,
            "arguments": {"chosen_urls": fd.chosen_urls, "new_query": fd.new_query}}


def generation_settings(backend, *, max_new_tokens: int, protocol: IbisProtocol) -> dict[str, Any]:
    """What a decision depends on besides the model and the item: recorded in every record and compared
    on resume (:func:`check_generation_settings`). A no-call budget at or above the token limit can
    never stop a row, so it is recorded as None (off)."""
    budget = getattr(backend, "no_call_tokens", None)
    return {"max_new_tokens": int(max_new_tokens), "decoding": "greedy", **protocol.record(),
            "no_call_tokens": budget if budget is not None and budget < max_new_tokens else None}


def _record(backend, item: IbisItem, framing: str, out: dict, seconds: float, max_new_tokens: int,
            protocol: IbisProtocol) -> dict[str, Any]:
    if protocol.name == "paper" and framing == "direct":
        cls = prose = classify_filter_reply(item, out)
    else:
        cls = classify_call(out["raw_text"], out["tool_calls"])
        prose = classify_reply(out["raw_text"], out["tool_calls"], out["prompt_text"])
    gen = generation_settings(backend, max_new_tokens=max_new_tokens, protocol=protocol)
    return {
        "item_id": item.id, "framing": framing, "label": item.label, "domain": item.domain,
        "expected": item.expected_action, "decision": cls["decision"], "method": cls["method"],
        "correct": cls["decision"] == item.expected_action, "tool_name": cls["name"], "arguments": cls["arguments"],
        "readout": "call",
        "decision_prose": prose["decision"], "method_prose": prose["method"],
        "correct_prose": prose["decision"] == item.expected_action,
        "raw_text": out["raw_text"], "structured_tool_calls": out["tool_calls"], "finish_reason": out["finish_reason"],
        "input_tokens": out["input_tokens"], "output_tokens": out["output_tokens"], "rendering": out["rendering"],
        "seconds": round(seconds, 3), "backend": backend.kind, "model": backend.name, RECORDED_GENERATION_LIMIT: max_new_tokens,
        "forced_choice": out.get("forced_choice"), "forced_choice_control": out.get("forced_choice_control"),
        "protocol": protocol.name, "reminder": gen["reminder"], "generation": gen,
    }


def readouts(rec: dict) -> dict[str, Any]:
    """A decision record with both readouts (see the module docstring), also for records written before
    call-only parsing (``readout`` absent): there ``decision`` was the prose readout, so the call-only
    decision is it when its method was a call, else unparseable."""
    if rec.get("readout") == "call" or "decision" not in rec or "method" not in rec:
        return rec  # current records, and minimal ones without a parse (nothing to split)
    rec = dict(rec)
    call = rec["method"] in CALL_METHODS or str(rec["method"]).startswith("filter-")
    rec["decision_prose"], rec["method_prose"], rec["correct_prose"] = rec["decision"], rec["method"], rec["correct"]
    if not call:
        rec.update(decision="unparseable", method="none", correct=rec["expected"] == "unparseable")
    rec["readout"] = "call"
    return rec


def record_generation(rec: dict) -> dict[str, Any]:
    """The generation settings a record was made under (records before the ``generation`` field: their
    recorded generation limit and protocol; a paper-protocol record from then used the old observer reminder)."""
    if "generation" in rec:
        return rec["generation"]
    proto = rec.get("protocol", "matched")
    return {"max_new_tokens": rec.get(RECORDED_GENERATION_LIMIT), "decoding": "greedy", "protocol": proto,
            "reminder": "identical" if proto != "paper" else "listing (before the verbatim observer reminder)",
            "no_call_tokens": None}


def check_generation_settings(folder: Path, settings: dict[str, Any]) -> None:
    """Refuse to resume ``folder`` with generation settings (max_new_tokens, decoding, protocol,
    reminder, no-call budget; :func:`generation_settings`) other than those its decisions were made
    with: one line naming the folder and the first setting that differs. Call before generating
    (``run_behaviour`` does unless ``force``)."""
    from attnprobe.errors import AttnprobeError

    folder = Path(folder)
    seen: list[dict] = [record_generation(r) for r in ModelFolderLayout(folder).read_decisions()]
    for old in seen:
        for key, new in settings.items():
            if key in old and old[key] != new:
                raise AttnprobeError(
                    f"{folder}: its decisions were made with {key}={old[key]!r}, this run asks for {key}={new!r}; "
                    "a resume would mix both: use another --folder, or --force to redo every decision")


def read_decisions(path: Path) -> list[dict]:
    """The latest record per (item, framing) of a model folder's decisions (``path``: the folder or its
    decisions file; :meth:`ModelFolderLayout.read_decisions`, the one reader), each with both readouts
    (:func:`readouts`)."""
    path = Path(path)
    layout = ModelFolderLayout(path.parent if path.name == DECISIONS_FILE else path)
    return [readouts(r) for r in layout.read_decisions()]


def decide_many(backend, pairs: list[tuple[IbisItem, str]], *, max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
                protocol: IbisProtocol | str = "paper", batched: bool = False, on_progress=None):
    """Decision records of (item, framing) pairs, yielded one by one (so each can be written as soon as
    it exists); ``batched``: one left-padded batch (in process only), else one call per pair.
    ``on_progress(new_tokens, rows_stopped, rows)``: per-row progress of the generation (in process)."""
    kw = {"on_progress": on_progress} if on_progress is not None else {}
    protocol = as_protocol(protocol)
    if batched and getattr(backend, "supports_batch", False):
        t0 = time.perf_counter()
        outs = backend.complete_many([build_framing(it, fr, protocol) for it, fr in pairs],
                                     max_new_tokens=max_new_tokens,
                                     controls=[copy_control_framing(it, fr, protocol) for it, fr in pairs],
                                     **kw)
        per = (time.perf_counter() - t0) / max(1, len(pairs))
        for (it, fr), out in zip(pairs, outs):
            yield _record(backend, it, fr, out, per, max_new_tokens, protocol)
    else:
        for it, fr in pairs:
            yield decide(backend, it, fr, max_new_tokens=max_new_tokens, protocol=protocol,
                         on_progress=on_progress)
