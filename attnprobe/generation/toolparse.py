"""Parse the next action out of generated text, whatever tool-call syntax the model used.

Small models rarely follow one format: we accept Qwen/Hermes ``<tool_call>{...}</tool_call>``, Qwen3.5 /
Qwen3-Coder XML calls inside ``<tool_call>`` (``<function=name><parameter=p>value</parameter></function>``,
read as seed 002's release reads them: :func:`xml_calls`),
Llama-3 style bare JSON (``{"name": ..., "parameters": ...}``), the smolagents ``Calling tools:
[...]`` list (JSON, or the Python repr that seed 001 appendix E writes: ``[{'id': ..., 'function':
{'name': 'web_search', 'arguments': {'query': ...}}}]``), fenced ```json blocks, ``Action: {...}`` and
Python-call style ``web_search("q")``.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from attnprobe.render.brackets import bracket_ends
from attnprobe.trajectory.schema import call_arguments
from attnprobe.trajectory.tags import closed

# (head, closing mark, whether an unclosed block runs to the end): blocks are read in linear time by
# :func:`_blocks`, as the regexes <tool_call>\s*(.*?)\s*(?:</tool_call>|$) and
# ```(?:json|tool_call|python)?\s*(.*?)``` (DOTALL) read them (the lazy regexes are quadratic on long
# whitespace runs and unclosed blocks: 40 KB of spaces after <tool_call> took 60 s)
_TAGGED = (re.compile(r"<tool_call>\s*"), "</tool_call>", True)
_FENCED = (re.compile(r"```(?:json|tool_call|python)?\s*"), "```", False)
_PYNAME = re.compile(r"\b([A-Za-z_][A-Za-z0-9_]*)\s*\(")


@dataclass
class ParsedCall:
    name: str
    arguments: dict = field(default_factory=dict)

    def to_openai(self, call_id: str) -> dict:
        return {"id": call_id, "type": "function",
                "function": {"name": self.name, "arguments": json.dumps(self.arguments, ensure_ascii=False)}}


def call_ids(messages: list[dict], k: int, prefix: str = "call") -> list[str]:
    """Ids for ``k`` new calls parsed from a reply to ``messages``: ``<prefix><n>`` numbered on from the
    calls already in the context. A function of the context alone, so a resumed run gives the same ids
    as an uninterrupted one, and ids stay unique within one conversation."""
    seen = sum(len(m.get("tool_calls") or []) for m in messages if isinstance(m, dict))
    return [f"{prefix}{seen + i + 1}" for i in range(k)]


_OPENER = re.compile(r"[{\[]")
_OPENERS = re.compile(r"[{\[]+")


def _json_objects(text: str) -> list[tuple[int, int, object]]:
    """Every top-level JSON value ({...} or [...]) that parses, with its span. A value nested deeper than
    the decoder's recursion limit is text, and so is the run of brackets that opens it (retrying each of
    100,000 nested brackets took a minute)."""
    dec = json.JSONDecoder()
    out, i, ends = [], 0, {}
    while (m := _OPENER.search(text, i)) is not None:
        i = m.start()
        if i not in ends:
            bracket_ends(text, i, ends)
        if ends[i] is None:  # unclosed: not JSON (and the decoder's error would count lines up to i)
            i += 1
            continue
        try:
            obj, end = dec.raw_decode(text, i)
            out.append((i, end, obj))
            i = end
            continue
        except json.JSONDecodeError:
            i += 1
        except RecursionError:
            i = _OPENERS.match(text, i).end()
    return out


def _python_literals(text: str) -> list[tuple[int, int, object]]:
    """Every top-level Python literal ({...} or [...]) that ``ast.literal_eval`` accepts, with its span
    (the Python-repr call lists of the smolagents format; never evaluated beyond literals). As in
    :func:`_json_objects`, a literal too deep to evaluate is text with the run of brackets that opens it."""
    out, i, ends = [], 0, {}
    while (m := _OPENER.search(text, i)) is not None:
        i = m.start()
        if i not in ends:
            bracket_ends(text, i, ends)
        end = ends[i]
        if end is not None:
            try:
                out.append((i, end, ast.literal_eval(text[i:end])))
                i = end
                continue
            except SyntaxError as exc:
                if "too many nested" in str(exc):  # the parser's nesting limit: skip the whole run
                    i = _OPENERS.match(text, i).end()
                    continue
            except (ValueError, TypeError):
                pass
            except (MemoryError, RecursionError):
                i = _OPENERS.match(text, i).end()
                continue
        i += 1
    return out




def _as_call(obj, known: set[str] | None) -> ParsedCall | None:
    if not isinstance(obj, dict):
        return None
    if "function" in obj and isinstance(obj["function"], dict):
        obj = obj["function"]
    name = obj.get("name") or obj.get("tool") or obj.get("tool_name") or obj.get("action")
    if not isinstance(name, str) or (known and name not in known):
        return None
    args = obj.get("arguments", obj.get("parameters", obj.get("args", obj.get("action_input", {}))))
    return ParsedCall(name, call_arguments({"name": name, "arguments": args}, on_error="input", dict_only=True))


def _calls_from(obj, known) -> list[ParsedCall]:
    items = obj if isinstance(obj, list) else [obj]
    return [c for c in (_as_call(x, known) for x in items) if c is not None]


_FUNCTION = re.compile(r"<function=([\w.]+)>")
_PARAMETER = re.compile(r"<parameter=(\w+)>")


def xml_value(raw: str):
    """A ``<parameter>`` value as the release decodes it (``utils/tool_parsers.py: parse_xml_tool_calls``):
    stripped, one pair of surrounding double quotes dropped, then JSON if it parses (the release uses json5;
    we use json, so json5's extras such as single-quoted strings stay text), else the text."""
    value = raw.strip()
    if value.startswith('"') and value.endswith('"'):
        value = value[1:-1]
    try:
        return json.loads(value)
    except (json.JSONDecodeError, RecursionError):
        return int(value) if value.isdigit() else value


def xml_calls(body: str, known: set[str] | None = None) -> list[ParsedCall]:
    """Qwen3.5 / Qwen3-Coder XML calls in one ``<tool_call>`` body, as seed 002's release parses them
    (i-DeepSearch/observation-masking, ``utils/tool_parsers.py: parse_xml_tool_calls``): every
    ``<function=([\\w.]+)>`` block up to its ``</function>`` (or the end) is one call, so one block may hold
    several; its parameters are ``<parameter=(\\w+)>`` up to the next ``</parameter>``, decoded by
    :func:`xml_value`. Read with ``str.find`` in linear time, as the release's regexes read it."""
    out = []
    heads = list(_FUNCTION.finditer(body))
    for m in heads:
        end = body.find("</function>", m.end())
        inner = body[m.end():] if end < 0 else body[m.end():end]
        args, pos = {}, 0
        while (p := _PARAMETER.search(inner, pos)) is not None:
            close = inner.find("</parameter>", p.end())
            if close < 0:  # no later parameter can close either
                break
            args[p.group(1)] = xml_value(inner[p.end():close])
            pos = close + len("</parameter>")
        if not known or m.group(1) in known:
            out.append(ParsedCall(m.group(1), args))
    return out


def parse_tool_calls(text: str, known_tools: list[str] | None = None) -> tuple[str, list[ParsedCall]]:
    """Return (text before the first call, calls). ``known_tools`` restricts names (recommended). A
    ``<tool_call>`` block is read as JSON first and, if that gives no call, as XML calls
    (:func:`xml_calls`), the release's order (``parse_tool_call_block``)."""
    known = set(known_tools) if known_tools else None
    for kind in (_TAGGED, _FENCED):
        calls, first = [], None
        for start, body in _blocks(text, *kind):
            xml = kind is _TAGGED and body.lstrip().startswith("<function=")  # never JSON (the release's json5 fails)
            found = xml_calls(body, known) if xml else [c for _, _, obj in _json_objects(body)
                                                        for c in _calls_from(obj, known)]
            if not found and kind is _TAGGED and not xml:
                found = xml_calls(body, known)
            if found and first is None:
                first = start
            calls += found
        if calls:
            return text[:first].strip(), calls
    for literals in (_json_objects, _python_literals):
        for start, _end, obj in literals(text):
            found = _calls_from(obj, known)
            if found:
                head = text[:start]
                head = re.sub(r"(Calling tools:|Action:)\s*$", "", head.rstrip())
                return head.strip(), found
    if known:
        for start, name, args_src in _py_calls(text):
            if name not in known:
                continue
            args = _py_args(args_src)
            if args is not None:
                return text[:start].strip(), [ParsedCall(name, args)]
    return text.strip(), []


def _blocks(text: str, head: re.Pattern, close: str, to_end: bool):
    """(start, text inside) of each block opened by ``head`` and closed by the first ``close`` after it
    (trailing whitespace dropped for ``<tool_call>``); an unclosed block runs to the end when ``to_end``."""
    pos = 0
    while (m := head.search(text, pos)) is not None:
        end = text.find(close, m.end())
        if end < 0:
            if to_end:
                yield m.start(), text[m.end():].rstrip()
            return
        body = text[m.end():end]
        yield m.start(), body.rstrip() if to_end else body
        pos = end + len(close)


def _py_calls(text: str):
    """``name(args)`` spans as the regex ``\\b(name)\\s*\\((.*?)\\)`` (DOTALL) finds them, in linear time
    (the lazy regex is quadratic on unclosed parentheses): (start, name, args text) up to the first ``)``."""
    pos = 0
    while (m := _PYNAME.search(text, pos)) is not None:
        close = text.find(")", m.end())
        if close < 0:  # no ")" after this "(": no later call closes either
            return
        yield m.start(), m.group(1), text[m.end():close]
        pos = close + 1


def _py_args(src: str) -> dict | None:
    try:
        node = ast.parse(f"f({src})", mode="eval").body
    except SyntaxError:
        return None
    if not isinstance(node, ast.Call):
        return None
    try:
        args = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords if kw.arg}
        if node.args:
            args.setdefault("input", ast.literal_eval(node.args[0]))
    except (ValueError, SyntaxError):
        return None
    return args


# ------------------------------------------------------------------ seed 002's native turn (the release)
def split_think(text: str) -> tuple[str | None, str]:
    """(reasoning, the rest) of a reply, as seed 002's release splits it (``deploy_agent.py``, "Step 1: Extract
    and remove <think> tags"): the text is cut at ``<tool_response>`` (a turn the model invented); with both
    tags the first ``<think>(.*?)</think>`` is the reasoning (stripped) and is removed; with ``</think>`` alone
    (a template that opened ``<think>\\n`` in the generation prompt, Qwen3.5's) the text up to the first
    ``</think>`` is. No ``</think>``: no reasoning (None)."""
    if "<tool_response>" in text:
        text = text[:text.find("<tool_response>")]
    if "<think>" in text and "</think>" in text:
        m = re.search(r"<think>(.*?)</think>", text, re.S)
        if m:
            return m.group(1).strip(), text.replace(m.group(0), "").strip()
    if "</think>" in text:
        head, _, rest = text.partition("</think>")
        return head.strip(), rest.strip()
    return None, text


def native_turn(text: str, reasoning: str | None, has_calls: bool) -> tuple[str, str | None]:
    """(content, reasoning_content) of the assistant message seed 002's release keeps for a reply
    (``deploy_agent.py``: ``"content": non_thinking_content if tool_call_text is None else ""`` and
    ``"reasoning_content": reasoning_content``): the reasoning is what :func:`split_think` finds unless the
    backend already gave it apart (``reasoning``: an endpoint's ``reasoning_content``); a turn with tool
    calls keeps no content; any other keeps the text after the first ``</think>``, stripped. Ours: the
    release empties the content when a ``<tool_call>`` block was written, we when calls were parsed (any
    syntax :func:`parse_tool_calls` reads)."""
    found, _ = split_think(text)
    if reasoning is None:
        reasoning = found
    if has_calls:
        return "", reasoning
    return (text.split("</think>", 1)[1].strip() if "</think>" in text else text.strip()), reasoning


# ------------------------------------------------------------------ tag-format agents (Search-R1 / IRCoT)
_TAGS = ("think", "search", "answer", "information")


@dataclass
class TagAction:
    """One reply of a tag-format agent (seed 004 §2, "Following Jin et al. (2025), LLMs are instructed to
    encapsulate their search queries, retrieved documents, and final answer between specially designated
    tokens"): the thoughts (``<think>``), the queries (``<search>``), the answer (``<answer>``, None when
    absent) and ``text``: the reply cut after the first closed ``</search>`` or ``</answer>``, which is
    what a tag agent keeps in its context (Search-R1 stops generating there)."""

    thoughts: list[str] = field(default_factory=list)
    queries: list[str] = field(default_factory=list)
    answer: str | None = None
    text: str = ""


ECHO_CONTEXT = 6  # characters beside an instruction's tag span that make its copy in a reply an echo


def echoed_spans(text: str, instructions: Sequence[str], context: int = ECHO_CONTEXT) -> list[tuple[int, int]]:
    """(start, end) of every tag span in ``text`` that copies one of the ``instructions``: the span
    (``<answer> and </answer>``) occurs there literally, and the ``context`` characters before or after it in
    the reply equal those around it in the instruction ("...inside <answer> and </answer>"). Such a span is
    the model quoting its instructions, not a tag it wrote: the answer "and" is no answer. A span written
    on its own (``</think> <answer> Beijing </answer>``) is not an echo, even when an example has its text."""
    out = []
    for instruction in instructions:
        for m in re.finditer(r"<(think|search|answer|information)>[^<]*</\1>", instruction):
            lit, before, after = m.group(0), instruction[:m.start()][-context:], instruction[m.end():][:context]
            pos = 0
            while (i := text.find(lit, pos)) >= 0:
                j = i + len(lit)
                if (len(before) == context and text[:i].endswith(before)) or \
                        (len(after) == context and text[j:].startswith(after)):
                    out.append((i, j))
                pos = j
    return sorted(set(out))


def parse_tags(text: str, instructions: Sequence[str] = ()) -> TagAction:
    """Parse ``<think>``, ``<search>`` and ``<answer>`` spans out of a tag-format reply. Only closed spans
    count, as in Search-R1 (``<(search|answer)>(.*?)</\\1>``): a reply cut off inside ``<search>`` is no
    query. Only what comes before the first ``</search>`` or ``</answer>`` counts (text a model writes after
    it, e.g. an invented ``<information>`` block, is dropped). Empty spans are ignored. Spans that echo
    one of the ``instructions`` the model was sent (:func:`echoed_spans`) are no tags: they neither answer
    nor search nor cut the reply. Linear time in the reply (:func:`attnprobe.trajectory.tags.closed`)."""
    seen = text
    for i, j in echoed_spans(text, instructions):  # blanked for parsing; ``text`` keeps what the model wrote
        seen = seen[:i] + " " * (j - i) + seen[j:]
    ends = [i + len(tag) for tag in ("</search>", "</answer>") if (i := seen.find(tag)) >= 0]
    cut, text = (seen[: min(ends)], text[: min(ends)]) if ends else (seen, text)
    spans = {name: [s.strip() for s in closed(cut, name) if s.strip()] for name in _TAGS}
    answers = spans["answer"]
    return TagAction(thoughts=spans["think"], queries=spans["search"], answer=answers[0] if answers else None,
                     text=text.strip())
