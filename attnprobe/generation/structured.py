"""Structured actions: each scaffold's action grammar, and decoding that can only write a valid action.

The seeds decode freely; a small model then rarely writes a parsable ``<search>`` tag or tool call, and a
closed-loop study has nothing to act on. With ``--structured-actions`` a reply is constrained to the
scaffold's action grammar (:class:`attnprobe.generation.chat.ActionFormat`), so every reply is an action
our parsers read. That changes the agent's behaviour: results with it are a different experiment
(docs/methods.md, "Structured actions").

- :func:`grammar_text`: the grammar as Lark (llguidance's dialect, plain Lark features only) or GBNF (the
  EBNF that xgrammar, vLLM and SGLang read). Every free-text field is a bounded character class
  (:data:`BOUNDS`), so a model cannot ramble forever, and excludes the characters that would let our
  parsers read a different action out of it.
- :func:`token_constraint` / :class:`Constraint` / :class:`RowState`: per-row token masks from llguidance
  for a decode loop; :func:`logits_processor`: the same for ``model.generate``.
- :func:`openai_extra_body` / :func:`vllm_sampling_params_kwargs`: the guided-decoding options of a vLLM or
  SGLang server and of vLLM's offline engine.

The call syntax is the one the model is told to use (``{"name": ..., "arguments": {...}}``, the runner's
``call_format`` and seed 002's system prompt) and :func:`attnprobe.generation.toolparse.parse_tool_calls`
reads; several seed-002 calls of one reply are one JSON list of such objects (the parser reads only the
first of several bare objects).
"""

from __future__ import annotations

import json
import time
import weakref
from collections.abc import Sequence
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
    """Token caps of the free-text fields, from ``fmt.max_tokens`` (empty when it is 0). With free-text budget
    F (the budget less the overhead of tags and JSON): IRCoT gives the query / answer min(32, F/3) and the
    think text the rest, so its longest action fits the budget; seed 002 and the runner give the reasoning
    line F/4 and each string argument F/(2 x calls), and allow only as many calls in one reply as F/48
    (1..4), so the usual action (one call of one or two arguments) fits, while a reply that uses every
    allowance can still reach the budget and be cut; seed 002's final response gives the explanation F/2
    and the answer F/4. Every cap is at least 4 tokens (a tiny budget may then be exceeded and the reply
    cut at max_tokens, as without caps)."""
    if fmt.max_tokens <= 0:
        return {}
    if fmt.scaffold == "ircot":
        free = max(fmt.max_tokens - OVERHEAD["ircot"], 12)
        span = max(4, min(32, free // 3))
        return {"query": span, "answer": span, "think": max(4, free - span)}
    free = max(fmt.max_tokens - OVERHEAD["call"], 12)
    calls = max(1, min(BOUNDS["calls"], free // 48)) if fmt.scaffold == "seed002" else 1
    final = max(fmt.max_tokens - OVERHEAD["final"], 12)
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
    characters (no escapes to get wrong), integers up to 6 digits. With ``fmt.max_tokens`` the Lark text
    also caps the free-text fields in tokens (:func:`token_caps`), so the action closes within the budget."""
    if fmt.scaffold == "ircot":
        root = _ircot(fmt.final, token_caps(fmt))
    elif fmt.scaffold == "seed002":
        root = _seed002(fmt)
    elif fmt.scaffold in ("nis-manager", "nis-worker"):
        root = _nis(fmt)
    else:
        raise ValueError(f"structured actions: unknown scaffold {fmt.scaffold!r}; use one of {', '.join(SCAFFOLDS)}")
    if dialect == "lark":
        capped: dict[str, str] = {}
        text = f"start: {_emit(root, 'lark', capped)}\n"
        return text + "".join(f"{name}{body}\n" for body, name in capped.items())
    if dialect == "gbnf":
        named: dict[str, str] = {}
        text = f"root ::= {_emit(root, 'gbnf', named)}\n"
        return text + "".join(f"{name} ::= {body}\n" for body, name in named.items())
    raise ValueError(f"structured actions: dialect must be 'lark' or 'gbnf', not {dialect!r}")


# ------------------------------------------------------------------ token masks (llguidance)
_LL: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # HF tokenizer -> (LLTokenizer, {fmt: Constraint})


def _ll_tokenizer(tokenizer):
    """llguidance's view of a fast HF tokenizer (built once per tokenizer: about a second)."""
    try:
        return _LL[tokenizer]
    except KeyError:
        pass
    import copy

    from llguidance import LLTokenizer

    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise ValueError("structured actions need a fast (Rust) Hugging Face tokenizer")
    backend = copy.copy(backend)
    backend.no_padding()
    backend.no_truncation()
    entry = (LLTokenizer(backend.to_str(), eos_token=tokenizer.eos_token_id), {})
    _LL[tokenizer] = entry
    return entry


class Constraint:
    """One compiled action grammar for one tokenizer; :meth:`start` gives a fresh row."""

    def __init__(self, lltok, fmt: ActionFormat, eos_id: int):
        from llguidance import LLMatcher

        self.fmt, self.lltok, self.eos_id = fmt, lltok, eos_id
        t0 = time.perf_counter()
        self._matcher = LLMatcher(lltok, LLMatcher.grammar_from_lark(grammar_text(fmt)), log_level=0)
        self.compile_seconds = time.perf_counter() - t0
        if self._matcher.is_error():
            raise ValueError(f"structured actions: the {fmt.scaffold} grammar does not compile: "
                             f"{self._matcher.get_error()[:200]}")

    def start(self) -> RowState:
        return RowState(self, self._matcher.deep_copy())


def allowed_rows(states: Sequence[RowState], vocab_size: int):
    """:meth:`RowState.allowed_array` of several rows at once, as a bool array [rows, vocab_size]: one bitmask
    for all rows (llguidance fills each row's words), unpacked by numpy in one call, so a batch of 48
    constrained rows costs one array operation instead of 48 (the decode loop masks a whole batch with it)."""
    import numpy as np

    out = np.zeros((len(states), vocab_size), dtype=bool)
    if not states:
        return out
    from llguidance.numpy import fill_next_token_bitmask

    n = states[0].constraint.lltok.vocab_size
    bits = np.zeros((len(states), (n + 31) // 32), dtype=np.int32)
    live = []
    for i, st in enumerate(states):
        if st.finished:
            eos = st.constraint.eos_id
            if eos is not None and eos < vocab_size:
                out[i, eos] = True
            continue
        fill_next_token_bitmask(st.matcher, bits, i)
        if st.matcher.is_error():
            raise RuntimeError(f"structured actions: {st.matcher.get_error()[:200]}")
        live.append(i)
    if live:
        # bit i of word w is token 32*w+i (little-endian words): numpy unpacks it in microseconds
        flags = np.unpackbits(bits[live].view(np.uint8), axis=1, bitorder="little")
        k = min(vocab_size, n)
        out[live, :k] = flags[:, :k].astype(bool)
    return out


class RowState:
    """One row's place in the grammar. ``allowed`` gives the tokens that keep the reply valid; ``accept`` the
    token chosen. ``finished``: the action is complete (the grammar allows nothing more, or EOS was taken);
    then only EOS is allowed."""

    def __init__(self, constraint: Constraint, matcher):
        self.constraint, self.matcher = constraint, matcher
        self.finished = False
        self.tokens: list[int] = []

    def allowed(self, vocab_size: int):
        """A bool tensor of ``vocab_size``: True where the token keeps the reply valid (ids past the
        tokenizer's vocabulary, e.g. a model's padded embedding rows, are never allowed)."""
        import torch

        return torch.from_numpy(self.allowed_array(vocab_size))

    def allowed_array(self, vocab_size: int):
        """:meth:`allowed` as a numpy array. Built in numpy and handed to torch once: torch's small ops are
        slow under thread contention (a 49k ``torch.zeros`` took 13 ms on a loaded 2-core machine)."""
        return allowed_rows([self], vocab_size)[0]

    def accept(self, token_id: int) -> None:
        token_id = int(token_id)
        if self.finished:  # EOS or padding after the action: nothing more to check
            return
        if token_id == self.constraint.eos_id and self.matcher.is_accepting():
            self.finished = True
            return
        if not self.matcher.consume_token(token_id):
            text = self.constraint.lltok.decode_str([token_id])
            raise ValueError(f"structured actions: token {token_id} ({text!r}) breaks the "
                             f"{self.constraint.fmt.scaffold} grammar after {len(self.tokens)} tokens")
        self.tokens.append(token_id)
        if self.matcher.is_stopped():
            self.finished = True


def token_constraint(tokenizer, fmt: ActionFormat) -> Constraint:
    """The compiled grammar of ``fmt`` for ``tokenizer`` (cached per tokenizer and format)."""
    lltok, cache = _ll_tokenizer(tokenizer)
    if fmt not in cache:
        cache[fmt] = Constraint(lltok, fmt, tokenizer.eos_token_id)
    return cache[fmt]


def accepts(tokenizer, fmt: ActionFormat, text: str) -> bool:
    """Whether ``text`` is a complete action of ``fmt`` (its tokens, as ``tokenizer`` writes them)."""
    row = token_constraint(tokenizer, fmt).start()
    ids = tokenizer.encode(text, add_special_tokens=False)
    return row.matcher.consume_tokens(ids) and row.matcher.is_accepting()


@lru_cache(maxsize=1)
def _processor_class():
    import torch
    from transformers import LogitsProcessor

    class ActionLogitsProcessor(LogitsProcessor):
        """Masks each row's next-token scores to its action grammar (rows whose format is None decode
        freely). ``prompt_width``: the (left-padded) prompt length; tokens after it are the reply."""

        def __init__(self, tokenizer, fmts, prompt_width: int):
            self.rows = [token_constraint(tokenizer, f).start() if f is not None else None for f in fmts]
            self.prompt_width = prompt_width

        def __call__(self, input_ids, scores):
            import numpy as np

            vocab = scores.shape[-1]
            ok = np.ones((len(self.rows), vocab), dtype=bool)  # free rows: everything allowed
            for r, row in enumerate(self.rows):
                if row is None:
                    continue
                for t in input_ids[r, self.prompt_width + len(row.tokens) + row.finished:].tolist():
                    row.accept(t)
                    if row.finished:
                        break
                ok[r] = row.allowed_array(vocab)
            return scores.masked_fill(~torch.from_numpy(ok).to(scores.device), float("-inf"))

    return ActionLogitsProcessor


def logits_processor(tokenizer, fmts, prompt_width: int):
    """An HF ``LogitsProcessor`` for ``model.generate``: row ``r`` follows ``fmts[r]`` (None: free). Beam
    search is not supported (one state per row)."""
    return _processor_class()(tokenizer, list(fmts), prompt_width)


# ------------------------------------------------------------------ servers and vLLM's engine
SERVERS = ("vllm", "vllm-legacy", "sglang")


def openai_extra_body(fmt: ActionFormat, server: str = "vllm") -> dict:
    """The ``extra_body`` of a chat-completions request that constrains the reply to ``fmt``'s grammar:

    - ``vllm`` (vLLM >= 0.10.2, where ``structured_outputs`` replaced the ``guided_*`` fields; they were
      removed in 0.12.0): ``{"structured_outputs": {"grammar": GBNF}}``;
    - ``vllm-legacy`` (vLLM before 0.12): ``{"guided_grammar": GBNF}``; vLLM 0.12 and later ignore that
      field without an error and decode freely, so use it only for an older server;
    - ``sglang``: ``{"ebnf": GBNF}`` (its default xgrammar backend; llguidance reads it too).

    GBNF, not Lark: xgrammar (vLLM's default backend) reads EBNF natively, and vLLM's guidance backend
    converts GBNF to Lark (llguidance's ``grammar_from``), so one text serves every backend."""
    g = grammar_text(fmt, "gbnf")
    if server == "vllm":
        return {"structured_outputs": {"grammar": g}}
    if server == "vllm-legacy":
        return {"guided_grammar": g}
    if server == "sglang":
        return {"ebnf": g}
    raise ValueError(f"structured actions: server must be one of {', '.join(SERVERS)}, not {server!r}")


def vllm_sampling_params_kwargs(fmt: ActionFormat) -> dict:
    """Keyword arguments for vLLM's ``SamplingParams`` that constrain the reply to ``fmt``'s grammar:
    ``structured_outputs=StructuredOutputsParams(grammar=...)`` (vLLM >= 0.10.2), else
    ``guided_decoding=GuidedDecodingParams(grammar=...)`` (older). vLLM is imported here, not before."""
    g = grammar_text(fmt, "gbnf")
    try:
        from vllm.sampling_params import StructuredOutputsParams
    except ImportError:
        pass
    else:
        return {"structured_outputs": StructuredOutputsParams(grammar=g)}
    try:
        from vllm.sampling_params import GuidedDecodingParams
    except ImportError:
        raise ValueError("structured actions with --generator vllm need vllm installed "
                         "(vllm.sampling_params has neither StructuredOutputsParams nor GuidedDecodingParams)") from None
    return {"guided_decoding": GuidedDecodingParams(grammar=g)}
