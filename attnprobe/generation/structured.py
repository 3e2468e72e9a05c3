"""Structured actions: each scaffold's action grammar, and decoding that can only write a valid action.

The seeds decode freely; a small model then rarely writes a parsable ``<search>`` tag or tool call, and a
closed-loop study has nothing to act on. With ``--structured-actions`` a reply is constrained to the
scaffold's action grammar (:class:`attnprobe.generation.chat.ActionFormat`), so every reply is an action
our parsers read. That changes the agent's behaviour: results with it are a different experiment
(docs/methods.md, "Structured actions").

- :func:`grammar_text` (:mod:`attnprobe.generation.grammars`): the grammar as Lark (llguidance's dialect) or
  GBNF (the EBNF that xgrammar, vLLM and SGLang read). Every free-text field is a bounded character class
  (:data:`BOUNDS`, and :func:`token_caps` in tokens), so a model cannot ramble forever, and excludes the
  characters that would let our parsers read a different action out of it.
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

import time
import weakref
from collections.abc import Sequence
from functools import lru_cache

from attnprobe.generation.chat import ActionFormat
from attnprobe.generation.grammars import BOUNDS, SCAFFOLDS, grammar_text, token_caps

__all__ = ["BOUNDS", "SCAFFOLDS", "Constraint", "RowState", "accepts", "allowed_rows", "grammar_text",
           "logits_processor", "openai_extra_body", "token_caps", "token_constraint", "vllm_sampling_params_kwargs"]

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
