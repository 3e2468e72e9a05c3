"""The scaffolds' action grammars (``--structured-actions``), as text: Lark (llguidance) or GBNF (xgrammar,
vLLM, SGLang), built from one small grammar tree so that the two accept the same texts.

:func:`grammar_text` is the entry point; :data:`BOUNDS` bounds every free-text field in characters and
:func:`token_caps` in tokens (from the reply's budget). :func:`follows_grammar` checks a reply's text against
the same grammar (its character bounds; a Python regex made from the same tree), so a study can tell when a
server was sent the grammar and did not apply it. Turning a grammar into token masks and server
options is :mod:`attnprobe.generation.structured`'s; docs/methods.md ("Structured actions") gives the rules.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache

from attnprobe.generation.chat import ActionFormat

SCAFFOLDS = ("ircot", "seed002", "nis-manager", "nis-worker")

# Characters per free-text field (a token holds at least one, so these bound tokens too), and calls per reply.
BOUNDS = {
    "think": 300,        # IRCoT <think> text
    "query": 100,        # IRCoT <search> text
    "answer": 100,       # IRCoT <answer> text and seed 002's Exact Answer line
    "explanation": 400,  # seed 002's Explanation line
    "preamble": 200,     # the one line of reasoning allowed before a tool call
    "argument": 200,     # a string argument of a tool call
    "digits": 6,         # an integer argument
    "calls": 4,          # tool calls in one seed-002 reply
}


# ------------------------------------------------------------------ a tiny grammar AST, emitted as Lark or GBNF
@dataclass(frozen=True)
class _Lit:
    text: str


@dataclass(frozen=True)
class _Term:
    """One terminal: ``lark`` is a regex (Rust syntax, without slashes), ``gbnf`` the same language in GBNF;
    ``tokens``: at most this many tokens (llguidance's ``max_tokens`` on a Lark rule; 0: no cap; GBNF has
    no token caps, so servers get the character bounds only)."""

    lark: str
    gbnf: str
    tokens: int = 0


@dataclass(frozen=True)
class _Seq:
    items: tuple


@dataclass(frozen=True)
class _Alt:
    items: tuple


@dataclass(frozen=True)
class _Opt:
    item: object


def _seq(*items):
    flat, out = [], []
    for it in items:
        flat.extend(it.items if isinstance(it, _Seq) else [it])
    for it in flat:  # adjacent literals become one
        if out and isinstance(it, _Lit) and isinstance(out[-1], _Lit):
            out[-1] = _Lit(out[-1].text + it.text)
        else:
            out.append(it)
    return out[0] if len(out) == 1 else _Seq(tuple(out))


def _alt(*items):
    return items[0] if len(items) == 1 else _Alt(tuple(items))


def _text(first: str, rest: str, n: int, lead_space: bool = False, tokens: int = 0) -> _Term:
    """A field of 1..n characters: one of class ``first`` (no blank), then up to n-1 of class ``rest``;
    ``lead_space``: one optional space before it (``<search> query </search>``); ``tokens``: a token cap."""
    sp_l, sp_g = (" ?", '" "? ') if lead_space else ("", "")
    return _Term(f"{sp_l}{first}{rest}{{0,{n - 1}}}", f"{sp_g}{first} {rest}{{0,{n - 1}}}", tokens)


# Tokens a reply spends outside its free-text fields: tags, JSON keys, separators (generous: SmolLM2 spells
# "<think>" in 3 tokens, a call's '{"name": "search", "arguments": {"query": "' in about 15).
OVERHEAD = {"ircot": 24, "call": 24, "final": 16}


def token_caps(fmt: ActionFormat) -> dict[str, int]:
    """Token caps of the free-text fields, from ``fmt.max_new_tokens`` (empty when it is 0). With free-text budget
    F (the budget less the overhead of tags and JSON): IRCoT gives the query / answer min(32, F/3) and the
    think text the rest, so its longest action fits the budget; seed 002 and the runner give the reasoning
    line F/4 and each string argument F/(2 x calls), and allow only as many calls in one reply as F/48
    (1..4), so the usual action (one call of one or two arguments) fits, while a reply that uses every
    allowance can still reach the budget and be cut; seed 002's final response gives the explanation F/2
    and the answer F/4. Every cap is at least 4 tokens (a tiny budget may then be exceeded and the reply
    cut at max_new_tokens, as without caps)."""
    if fmt.max_new_tokens <= 0:
        return {}
    if fmt.scaffold == "ircot":
        free = max(fmt.max_new_tokens - OVERHEAD["ircot"], 12)
        span = max(4, min(32, free // 3))
        return {"query": span, "answer": span, "think": max(4, free - span)}
    free = max(fmt.max_new_tokens - OVERHEAD["call"], 12)
    calls = max(1, min(BOUNDS["calls"], free // 48)) if fmt.scaffold == "seed002" else 1
    final = max(fmt.max_new_tokens - OVERHEAD["final"], 12)
    return {"preamble": max(4, free // 4), "argument": max(4, free // (2 * calls)), "calls": calls,
            "explanation": max(4, final // 2), "answer": max(4, final // 4)}


def _emit(node, dialect: str, named: dict | None = None) -> str:
    """``node`` as grammar text. GBNF terminals become named rules (``named``: gbnf text -> name), so an
    optional terminal reads ``t1?`` rather than ``(x{1,300})?`` (which llguidance's GBNF reader misparses);
    so do token-capped Lark terminals (``c1[max_tokens=N]: /.../``: llguidance caps rules, not regexes)."""
    if isinstance(node, _Lit):
        return json.dumps(node.text)
    if isinstance(node, _Term):
        if dialect == "lark":
            if not node.tokens:
                return f"/{node.lark}/"
            return named.setdefault(f"[max_tokens={node.tokens}]: /{node.lark}/", f"c{len(named) + 1}")
        return named.setdefault(node.gbnf, f"t{len(named) + 1}")
    if isinstance(node, _Seq):
        return " ".join(_emit(i, dialect, named) for i in node.items)
    if isinstance(node, _Alt):
        return "(" + " | ".join(_emit(i, dialect, named) for i in node.items) + ")"
    if isinstance(node, _Opt):
        return f"({_emit(node.item, dialect, named)})?"
    raise TypeError(node)


# character classes (the same text in both dialects); blanks are space, tab, CR, LF
_NOTAG = r"[^<>]"
_NOTAG_LINE = r"[^<>\n]"
_NOTAG_WORD = r"[^<> \t\r\n]"
# the Explanation and Exact Answer lines: no ':' (else extract_answer could read an earlier "exact answer:"),
# no '{' '(' '<' '`' (no JSON object, Python call, <tool_call> or fence: parse_tool_calls finds no call)
_FINAL_LINE = r"[^{}()<>`:\n]"
_FINAL_WORD = r"[^{}()<>`: \t\r\n]"
# the line before a call: no brackets at all (the call is the first thing parse_tool_calls finds) and no ':'
_PRE_LINE = r"[^{}()\[\]<>`:\n]"
_PRE_WORD = r"[^{}()\[\]<>`: \t\r\n]"
# a JSON string argument: no quote or backslash (no escapes), no control characters, no brackets or tags
_ARG = r'[^"\\{}\[\]<>`\x00-\x1f]'
_ARG_WORD = r'[^"\\{}\[\]<>` \x00-\x1f]'


def _ircot(final: bool, caps: dict):
    span = {k: _text(_NOTAG_WORD, _NOTAG_LINE, BOUNDS[k], lead_space=True, tokens=caps.get(k, 0))
            for k in ("query", "answer")}
    think = _Term(f"{_NOTAG}{{1,{BOUNDS['think']}}}", f"{_NOTAG}{{1,{BOUNDS['think']}}}", caps.get("think", 0))
    answer = _seq(_Lit("<answer>"), span["answer"], _Lit("</answer>"))
    act = answer if final else _alt(_seq(_Lit("<search>"), span["query"], _Lit("</search>")), answer)
    return _seq(_Lit("<think>"), _Opt(think), _Lit("</think>"), _Opt(_Term(r"[ \n]", r"[ \n]")), act)


def _value(prop: str, schema: dict, caps: dict):
    """The grammar of one argument value (the JSON schema types our tools use)."""
    if "enum" in schema:
        return _alt(*(_Lit(json.dumps(v, ensure_ascii=False)) for v in schema["enum"]))
    kind = schema.get("type")
    if kind == "string":
        return _seq(_Lit('"'), _text(_ARG_WORD, _ARG, BOUNDS["argument"], tokens=caps.get("argument", 0)), _Lit('"'))
    if kind == "integer":
        d = BOUNDS["digits"]
        return _Term(f"0|[1-9][0-9]{{0,{d - 1}}}", f'"0" | [1-9] [0-9]{{0,{d - 1}}}')
    if kind == "number":
        d = BOUNDS["digits"]
        return _Term(f"-?(0|[1-9][0-9]{{0,{d - 1}}})(\\.[0-9]{{1,4}})?",
                     f'"-"? ("0" | [1-9] [0-9]{{0,{d - 1}}}) ("." [0-9]{{1,4}})?')
    if kind == "boolean":
        return _alt(_Lit("true"), _Lit("false"))
    raise ValueError(f"structured actions: tool argument {prop!r} has type {kind!r}; "
                     "only string, integer, number, boolean and enum are supported")


def _call(tool: dict, caps: dict):
    """``{"name": "<name>", "arguments": {...}}``: required arguments in schema order, then optional ones."""
    fn = tool.get("function", tool)
    params = fn.get("parameters") or {}
    props = params.get("properties") or {}
    required = [p for p in props if p in set(params.get("required") or [])]
    optional = [p for p in props if p not in required]

    def prop(p):
        return _seq(_Lit(json.dumps(p, ensure_ascii=False) + ": "), _value(p, props[p], caps))

    body = []
    for i, p in enumerate(required):
        body += [_Lit(", ")] * bool(i) + [prop(p)]
    if required:
        body += [_Opt(_seq(_Lit(", "), prop(p))) for p in optional]
    elif optional:  # none required: a chain, each optional after the one before
        chain = None
        for p in reversed(optional):
            chain = _seq(prop(p), *([_Opt(_seq(_Lit(", "), chain))] if chain is not None else []))
        body = [_Opt(chain)]
    head = json.dumps({"name": fn["name"]}, ensure_ascii=False)[:-1] + ', "arguments": {'
    return _seq(_Lit(head), *body, _Lit("}}"))


def _tools(fmt: ActionFormat) -> list[dict]:
    try:
        tools = json.loads(fmt.tools) if fmt.tools else []
    except json.JSONDecodeError as exc:
        raise ValueError(f"structured actions: ActionFormat.tools is not JSON ({exc.msg}, char {exc.pos})") from None
    if not isinstance(tools, list) or not tools:
        raise ValueError(f"structured actions: scaffold {fmt.scaffold!r} needs its tools (a JSON list of schemas)")
    return tools


def _preamble(caps: dict):
    return _Opt(_seq(_text(_PRE_WORD, _PRE_LINE, BOUNDS["preamble"], tokens=caps.get("preamble", 0)), _Lit("\n")))


def _seed002(fmt: ActionFormat):
    caps = token_caps(fmt)
    call = _alt(*(_call(t, caps) for t in _tools(fmt)))
    more = None  # 1..calls-1 further calls, each after ", "
    for _ in range(caps.get("calls", BOUNDS["calls"]) - 1):
        more = _seq(_Lit(", "), call, *([_Opt(more)] if more is not None else []))
    calls = call if more is None else _alt(call, _seq(_Lit("["), call, more, _Lit("]")))
    final = _seq(_Lit("Explanation: "), _text(_FINAL_WORD, _FINAL_LINE, BOUNDS["explanation"],
                                              tokens=caps.get("explanation", 0)),
                 _Lit("\nExact Answer: "), _text(_FINAL_WORD, _FINAL_LINE, BOUNDS["answer"],
                                                 tokens=caps.get("answer", 0)),
                 _Lit("\nConfidence: "), _Term("100|[1-9]?[0-9]", '"100" | [1-9]? [0-9]'), _Lit("%"))
    return final if fmt.final else _alt(_seq(_preamble(caps), calls), final)


def _nis(fmt: ActionFormat):
    tools = _tools(fmt)
    if fmt.final:
        tools = [t for t in tools if t.get("function", t).get("name") == "final_answer"] or tools
    caps = token_caps(fmt)
    return _seq(_preamble(caps), _alt(*(_call(t, caps) for t in tools)))


def _root(fmt: ActionFormat):
    """The grammar tree of ``fmt``."""
    if fmt.scaffold == "ircot":
        return _ircot(fmt.final, token_caps(fmt))
    if fmt.scaffold == "seed002":
        return _seed002(fmt)
    if fmt.scaffold in ("nis-manager", "nis-worker"):
        return _nis(fmt)
    raise ValueError(f"structured actions: unknown scaffold {fmt.scaffold!r}; use one of {', '.join(SCAFFOLDS)}")


@lru_cache(maxsize=256)
def grammar_text(fmt: ActionFormat, dialect: str = "lark") -> str:
    """The action grammar of ``fmt`` as Lark (``start`` rule; llguidance, vLLM's guidance backend) or GBNF
    (``root`` rule; xgrammar, llama.cpp, vLLM's and SGLang's ``ebnf``). The two accept the same texts.

    - ``ircot``: ``<think>`` (0..300 characters, no ``<`` ``>``) ``</think>``, an optional space or newline,
      then ``<search>`` query ``</search>`` or ``<answer>`` answer ``</answer>`` (one line, 1..100 characters,
      one optional leading space, then a non-blank); ``final``: the answer only.
    - ``seed002``: an optional reasoning line (1..200 characters, no brackets, no ``:``) and a newline, then one
      call ``{"name": ..., "arguments": {...}}`` of ``fmt.tools`` or a JSON list of 2..4 of them; or the
      final response ``Explanation: ...`` / ``Exact Answer: ...`` / ``Confidence: N%`` (seed 002's format;
      the lines 1..400 and 1..100 characters without ``{ } ( ) < > ` :``, N 0..100); ``final``: that only.
    - ``nis-manager`` / ``nis-worker``: the optional reasoning line, then exactly one call of ``fmt.tools``
      (the runner's "Reply with one tool call in JSON"); ``final``: final_answer only.

    Call arguments follow each tool's JSON schema: its required properties in order, then optional ones;
    strings 1..200 characters without quotes, backslashes, brackets, ``<`` ``>``, backticks or control
    characters (no escapes to get wrong), integers up to 6 digits. With ``fmt.max_new_tokens`` the Lark text
    also caps the free-text fields in tokens (:func:`token_caps`), so the action closes within the budget."""
    root = _root(fmt)
    if dialect == "lark":
        capped: dict[str, str] = {}
        text = f"start: {_emit(root, 'lark', capped)}\n"
        return text + "".join(f"{name}{body}\n" for body, name in capped.items())
    if dialect == "gbnf":
        named: dict[str, str] = {}
        text = f"root ::= {_emit(root, 'gbnf', named)}\n"
        return text + "".join(f"{name} ::= {body}\n" for body, name in named.items())
    raise ValueError(f"structured actions: dialect must be 'lark' or 'gbnf', not {dialect!r}")


# ------------------------------------------------------------------ checking a reply (text, not tokens)
def _regex(node) -> str:
    """``node`` as a Python regex (the Lark terminals are regexes Python reads as they are)."""
    if isinstance(node, _Lit):
        return re.escape(node.text)
    if isinstance(node, _Term):
        return f"(?:{node.lark})"
    if isinstance(node, _Seq):
        return "".join(_regex(i) for i in node.items)
    if isinstance(node, _Alt):
        return "(?:" + "|".join(_regex(i) for i in node.items) + ")"
    if isinstance(node, _Opt):
        return f"(?:{_regex(node.item)})?"
    raise TypeError(node)


@lru_cache(maxsize=256)
def _compiled(fmt: ActionFormat) -> re.Pattern:
    return re.compile(_regex(_root(fmt)), re.S)


def follows_grammar(fmt: ActionFormat, text: str) -> bool:
    """Whether ``text`` (a reply as the model wrote it, blanks around it aside) is a complete action of
    ``fmt``'s grammar, by its character bounds (token caps are a decoder's, not the text's). A reply that was
    constrained always is; a server that ignored the grammar sends one that mostly is not."""
    return bool(isinstance(text, str) and _compiled(fmt).fullmatch(text.strip()))
