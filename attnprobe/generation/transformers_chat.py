"""Generation with an in-process transformers model: the one stack the runner, IBIS and the
OpenAI-compatible test server share.

- The prompt is rendered by :func:`attnprobe.render.rendering.render` with
  ``add_generation_prompt=True``, exactly as capture renders it (same fallbacks), so a recorded call
  can be captured later and the model sees identical tokens.
- Greedy decoding by default, sampling with ``temperature > 0``.
- Stop at call (optional): generation ends as soon as the text holds a complete call of an offered
  tool (small models tend to keep chatting after the JSON). With greedy decoding the reply is then a
  prefix of the full generation, so the parsed action is the same. Default: on when tools are offered.
- :meth:`TransformersChat.complete_many`: several prompts in one left-padded batch (several times
  faster on CPU; equal to one-by-one generation, checked in the tests); rows stop one by one.
- No-call budget (optional, ``no_call_tokens``): a row that has written that many tokens without
  opening a call (no ``{``, ``<tool_call>``, ``Calling tools``, ``name(`` ... and not inside an open
  ``<think>`` block) is stopped (``stopped_by="no_call"``), so one reply that never writes a call does
  not hold its whole batch up to the token limit. Off by default; IBIS sets it (docs/ibis.md).
- Per-row progress (optional ``on_progress(new_tokens, rows_stopped, rows)``): called every
  ``PROGRESS_EVERY`` new tokens, so a long batch shows where it is.
- :meth:`TransformersChat.complete_batch` (the :class:`~attnprobe.generation.chat.ChatRequest` seam a
  closed-loop study steps its episodes through): one batch, decoded by :mod:`attnprobe.generation.decode`
  with each request's own ``max_new_tokens``, temperature, tools and stop rules, so each reply is the one
  :meth:`complete` gives for that request (greedy; see ``docs/methods.md`` for the measured agreement).
  Prefix reuse: the KV cache of each ``episode`` is kept between turns (at most ``max_kept_episodes``,
  least recently used dropped; :meth:`end_episode` frees one) and a new turn prefills only from the first
  token where its prompt differs. ``stats`` counts tokens sent, prefilled and generated (``last_stats``:
  the last call). Structured actions (``request.actions``): each step masks the row's logits with the
  grammar :func:`attnprobe.generation.structured.token_constraint` builds.
- :meth:`TransformersChat.option_logprobs`: the log-probability of each of several continuations
  after a prompt (IBIS's forced choice), from one shared prefill.

Tool calls are parsed from the text by :mod:`attnprobe.generation.toolparse`; call ids are numbered
``call1``, ``call2``, ... over the life of one chat object.
"""

from __future__ import annotations

import logging
import zlib
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from attnprobe.generation.chat import (
    DEFAULT_MAX_NEW_TOKENS,
    ChatReply,
    ChatRequest,
    OneByOne,
    Prompt,
    request_prompt,
    tool_names,
)
from attnprobe.generation.toolparse import call_ids, parse_tool_calls

Request = tuple[list[dict], "list[dict] | None"]  # (messages, tools)
PROGRESS_EVERY = 16  # new tokens between two on_progress calls (ours: a redraw per ~second on CPU)
# What opens a call in any syntax toolparse reads (a name followed by "(" is added per request).
log = logging.getLogger(__name__)
MAX_KEPT_EPISODES = 64  # episodes whose KV cache is kept between turns (a study's --batch-size is below it)
CALL_OPENINGS = ("{", "<tool_call>", "[TOOL_CALLS]", "<|python_tag|>", "Calling tools", "Action:", "<function")


def opens_call(text: str, names: Sequence[str] = ()) -> bool:
    """Whether ``text`` has started a tool call, or is inside an unclosed ``<think>`` block (a thinking
    model has not had its say yet): the no-call budget leaves such a row alone."""
    if "<think>" in text and "</think>" not in text.split("<think>")[-1]:
        return True
    return any(m in text for m in CALL_OPENINGS) or any(f"{n}(" in text for n in names)


class TransformersChat(OneByOne):
    """Chat completions from a loaded model (``attnprobe.load_model``); see the module docstring.

    ``stop_at_call``: None = stop at a complete call when tools are offered (the runner's default),
    True/False = always/never (True still needs names: the offered tools or ``stop_names``).
    ``stop_names``: the tool names that count for stopping (default: the offered tools).
    ``stop_check_every``: decode and parse every N new tokens.
    ``no_call_tokens``: stop a row after this many new tokens without a call opening (None = never;
    see the module docstring).
    ``seed`` (sampling in :meth:`complete_batch`): None = torch's global generator; an int = each row
    draws from its own generator seeded with ``seed`` and the CRC-32 of its prompt's token ids, so a
    row's sample does not depend on the other rows of its batch or their order (a resumed study draws
    the same). ``max_kept_episodes``: episode caches kept for prefix reuse (0 = no reuse).
    """

    kind = "transformers"

    def __init__(self, loaded, *, stop_at_call: bool | None = None, stop_names: Sequence[str] | None = None,
                 stop_check_every: int = 4, call_prefix: str = "call", no_call_tokens: int | None = None,
                 seed: int | None = None, max_kept_episodes: int = MAX_KEPT_EPISODES):
        self.loaded = loaded
        self.name = loaded.name
        self.tokenizer = loaded.tokenizer
        self.stop_at_call = stop_at_call
        self.stop_names = tuple(stop_names) if stop_names else None
        self.stop_check_every = max(1, int(stop_check_every))
        self.call_prefix = call_prefix
        if no_call_tokens is not None and int(no_call_tokens) < 1:
            raise ValueError(f"no_call_tokens must be >= 1 or None (off); got {no_call_tokens}")
        self.no_call_tokens = None if no_call_tokens is None else int(no_call_tokens)
        if int(max_kept_episodes) < 0:
            raise ValueError(f"max_kept_episodes must be >= 0; got {max_kept_episodes}")
        self.seed = None if seed is None else int(seed)
        self.max_kept_episodes = int(max_kept_episodes)
        self._kept: OrderedDict[str, tuple[list[int], Any]] = OrderedDict()  # episode -> (ids, per-layer KV)
        self.stats = {"calls": 0, "requests": 0, "sent": 0, "prefilled": 0, "generated": 0}
        self.last_stats = dict(self.stats)

    def configured(self, **changes) -> TransformersChat:
        """A chat on the same loaded model with some options changed (its own call numbering)."""
        opts = {"stop_at_call": self.stop_at_call, "stop_names": self.stop_names,
                "stop_check_every": self.stop_check_every, "call_prefix": self.call_prefix,
                "no_call_tokens": self.no_call_tokens, "seed": self.seed,
                "max_kept_episodes": self.max_kept_episodes}
        opts.update(changes)
        return TransformersChat(self.loaded, **opts)

    # ------------------------------------------------------------------ prompts
    def prompt(self, messages: list[dict], tools: list[dict] | None = None) -> Prompt:
        """Render ``messages`` (+ ``tools``) with the generation prompt, as capture renders them."""
        from attnprobe.render.rendering import render
        from attnprobe.trajectory.schema import Trajectory

        rendered = render(Trajectory(id="prompt", messages=messages, tools=tools), self.tokenizer,
                          add_generation_prompt=True)
        return Prompt(ids=rendered.input_ids.tolist(), text=rendered.text, rendering=rendered.rendering)

    def _pad_id(self) -> int:
        tok = self.tokenizer
        return tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id

    def _device(self):
        return getattr(self.loaded.model, "device", None)

    def stop_names_for(self, tools: list[dict] | None) -> list[str] | None:
        """The tool names whose complete call ends a reply to a request offering ``tools`` (None: no stop at
        a call). Public because every in-process backend stops and cuts the same way (vllm_chat)."""
        on = bool(tools) if self.stop_at_call is None else self.stop_at_call
        if not on:
            return None
        names = list(self.stop_names) if self.stop_names else tool_names(tools)
        return names or None

    def _stopping(self, n_prompt: int, names: list[str], on_progress=None):
        """Per-row stopping (rows are judged separately; a stopped row is padded while the others go on):

        - once the row's new text holds a complete call of one of ``names`` (greedy decoding makes the
          stopped text a prefix of the full generation, so the parsed action is the same);
        - with ``no_call_tokens``: once the row has written that many tokens without opening a call.

        ``stopped_at[r]`` is the row's length at its stop and ``reason[r]`` "call" or "no_call"."""
        import torch
        from transformers import StoppingCriteria, StoppingCriteriaList

        tok, every, budget = self.tokenizer, self.stop_check_every, self.no_call_tokens

        class _PerRow(StoppingCriteria):
            def __init__(self):
                self.done: torch.Tensor | None = None
                self.stopped_at: dict[int, int] = {}
                self.reason: dict[int, str] = {}

            def _stop(self, r: int, n_new: int, why: str) -> None:
                self.done[r] = True
                self.stopped_at[r], self.reason[r] = n_new, why

            def __call__(self, input_ids, scores, **kwargs):
                rows = input_ids.shape[0]
                if self.done is None:
                    self.done = torch.zeros(rows, dtype=torch.bool)
                n_new = input_ids.shape[1] - n_prompt
                check_call = bool(names) and n_new > 0 and n_new % every == 0
                check_budget = budget is not None and n_new == budget
                if check_call or check_budget:
                    for r in range(rows):
                        if self.done[r]:
                            continue
                        text = tok.decode(input_ids[r, n_prompt:], skip_special_tokens=True)
                        # every call syntax toolparse accepts closes with "}" or ")": skip the parse until then
                        if check_call and ("}" in text or ")" in text or "</function>" in text) and parse_tool_calls(text, names)[1]:
                            self._stop(r, n_new, "call")
                        elif check_budget and not opens_call(text, names):
                            self._stop(r, n_new, "no_call")
                if on_progress is not None and n_new > 0 and n_new % PROGRESS_EVERY == 0:
                    on_progress(n_new, int(self.done.sum()), rows)
                return self.done.to(input_ids.device).clone()

        return StoppingCriteriaList([_PerRow()])

    def _gen_kwargs(self, max_new_tokens: int, temperature: float) -> dict[str, Any]:
        kw: dict[str, Any] = {"max_new_tokens": max_new_tokens, "do_sample": temperature > 0,
                              "pad_token_id": self._pad_id()}
        if temperature > 0:
            kw["temperature"] = temperature
        return kw

    # ------------------------------------------------------------------ generation
    def complete(self, messages: list[dict], tools: list[dict] | None = None, *, max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
                 temperature: float = 0.0, on_progress=None) -> ChatReply:
        import torch

        prompt = self.prompt(messages, tools)
        ids = torch.as_tensor(prompt.ids)[None]
        if self._device() is not None:
            ids = ids.to(self._device())
        kw, stop = self.generation_settings(len(prompt.ids), tools, max_new_tokens=max_new_tokens, temperature=temperature,
                                            on_progress=on_progress)
        with torch.inference_mode():
            out = self.loaded.model.generate(ids, attention_mask=torch.ones_like(ids), **kw)
        return self.finish(prompt, out[0, ids.shape[1]:].tolist(), tools, max_new_tokens, messages, stop)

    def generation_settings(self, n_prompt: int, tools: list[dict] | None = None, *, max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
                            temperature: float = 0.0, on_progress=None) -> tuple[dict[str, Any], Any]:
        """The ``model.generate`` keywords :meth:`complete` uses for one prompt of ``n_prompt`` tokens
        (a fresh stopping criterion each call), and that criterion (None when nothing stops early):
        whoever decodes the prompt another way (e.g. from a captured KV cache) passes these and hands
        the new tokens to :meth:`finish`, and gets the reply :meth:`complete` would give."""
        kw = self._gen_kwargs(max_new_tokens, temperature)
        names = self.stop_names_for(tools) or []
        stop = None
        if names or self.no_call_tokens is not None or on_progress is not None:
            stop = kw["stopping_criteria"] = self._stopping(n_prompt, names, on_progress)
        return kw, stop

    def finish(self, prompt: Prompt, new: list[int], tools: list[dict] | None, max_new_tokens: int,
               messages: list[dict], stop: Any = None) -> ChatReply:
        """The reply for one prompt's ``new`` token ids, generated with :meth:`generation_settings`."""
        no_call = stop is not None and stop[0].reason.get(0) == "no_call"
        return self.make_reply(prompt, new, tools, max_new_tokens, messages, no_call=no_call)

    def complete_many(self, requests: Sequence[Request], *, max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
                      temperature: float = 0.0, on_progress=None) -> list[ChatReply]:
        """:meth:`complete` for several (messages, tools) requests in one left-padded batch. With
        stop-at-call on, each row stops once it holds a complete call of a stop name common to every
        request; with ``no_call_tokens``, once it has written that many tokens without opening a call
        (otherwise at its end-of-sequence token or ``max_new_tokens``). ``on_progress``: see the module
        docstring."""
        import torch

        prompts = [self.prompt(messages, tools) for messages, tools in requests]
        pad = self._pad_id()
        width = max(len(p.ids) for p in prompts)
        ids = torch.tensor([[pad] * (width - len(p.ids)) + p.ids for p in prompts])
        mask = torch.tensor([[0] * (width - len(p.ids)) + [1] * len(p.ids) for p in prompts])
        if self._device() is not None:
            ids, mask = ids.to(self._device()), mask.to(self._device())
        kw = self._gen_kwargs(max_new_tokens, temperature)
        name_sets = [self.stop_names_for(tools) for _, tools in requests]
        names = sorted(set.intersection(*(set(n or ()) for n in name_sets))) if all(name_sets) else []
        stop = None
        if names or self.no_call_tokens is not None or on_progress is not None:
            stop = kw["stopping_criteria"] = self._stopping(width, names, on_progress)
        with torch.inference_mode():
            out = self.loaded.model.generate(ids, attention_mask=mask, **kw)
        reason = stop[0].reason if stop is not None else {}
        eos = self.tokenizer.eos_token_id
        replies = []
        for r, ((messages, tools), prompt, row) in enumerate(zip(requests, prompts, out)):
            new = row[width:].tolist()
            if reason.get(r) == "call":  # stopped at its call, then padded: cut at the call
                new = self.cut_at_call(new, names)
            elif reason.get(r) == "no_call":  # stopped for want of a call, then padded: cut there
                new = new[:stop[0].stopped_at[r]]
            elif eos is not None and eos in new:  # a finished row is padded up to the longest one
                new = new[: new.index(eos) + 1]
            replies.append(self.make_reply(prompt, new, tools, max_new_tokens, messages, no_call=reason.get(r) == "no_call"))
        return replies

    def complete_batch(self, requests: Sequence[ChatRequest]) -> list[ChatReply]:
        """One reply per request, in order, from one batch (see the module docstring and
        :mod:`attnprobe.generation.decode`). A model whose cache cannot be cropped and stitched (not a
        per-layer key/value cache) answers one request after another, without reuse."""
        import torch

        import attnprobe.generation.decode as dec

        requests = list(requests)
        if not requests:
            return []
        for r in requests:
            if int(r.max_new_tokens) < 1:
                raise ValueError(f"max_new_tokens must be >= 1; got {r.max_new_tokens}")
        prompts = [request_prompt(r, self.prompt, self.tokenizer) for r in requests]
        rows = []
        for req, p in zip(requests, prompts):
            kept = self._kept.pop(req.episode, None) if req.episode is not None else None
            state = dec.token_constraint(self.tokenizer, req.actions).start() if req.actions is not None else None
            gen = None
            if req.temperature > 0 and self.seed is not None:
                gen = torch.Generator(device=self._device() or "cpu")
                gen.manual_seed((self.seed * 1_000_003 + zlib.crc32(bytes(str(p.ids), "ascii"))) % 2**63)
            rows.append(dec.Row(ids=p.ids, max_new_tokens=int(req.max_new_tokens), temperature=float(req.temperature),
                                stop_names=self.stop_names_for(req.tools) or [], state=state, generator=gen,
                                kept=kept[1] if kept else None, kept_ids=kept[0] if kept else [],
                                capture=req.capture))
        eos = getattr(getattr(self.loaded.model, "generation_config", None), "eos_token_id", None)
        if eos is None:
            eos = self.tokenizer.eos_token_id
        eos_ids = frozenset([eos] if isinstance(eos, int) else (eos or []))
        rules = dec.StopRules(self.tokenizer, self.stop_check_every, self.no_call_tokens, eos_ids, opens_call)
        keep = [self.max_kept_episodes > 0 and r.episode is not None for r in requests]
        try:
            with torch.inference_mode():
                results = dec.decode(self.loaded.model, rows, rules, keep=keep)
        except dec.Unsupported as e:
            if any(r.actions is not None for r in requests):
                raise ValueError(f"structured actions need a per-layer key/value cache: {e}") from None
            log.info("generation batch: %s; one request after another", e)
            return OneByOne.complete_batch(self, requests)
        replies = []
        for req, p, res in zip(requests, prompts, results):
            reply = self.make_reply(p, res.new, req.tools, int(req.max_new_tokens), req.messages,
                                no_call=res.reason == "no_call")
            if res.reason == "grammar":
                reply.stopped_by = "grammar"
            if res.scorer is not None:
                reply.capture = self._loop_capture(req, res, p, len(requests))
            replies.append(reply)
            if res.cache is not None:
                self._kept[req.episode] = (res.cache_ids, res.cache)
                self._kept.move_to_end(req.episode)
        while len(self._kept) > self.max_kept_episodes:
            self._kept.popitem(last=False)
        sent = sum(len(p.ids) for p in prompts)
        call = {"calls": 1, "requests": len(requests), "sent": sent,
                "prefilled": sum(r.prefilled for r in results), "generated": sum(len(r.new) for r in results)}
        self.last_stats = call
        self.stats = {k: self.stats[k] + v for k, v in call.items()}
        log.info("generation batch: %d requests; sent %s tokens, prefilled %s (reused %s); generated %s",
                 call["requests"], f"{sent:,}", f"{call['prefilled']:,}", f"{sent - call['prefilled']:,}",
                 f"{call['generated']:,}")
        return replies

    def _loop_capture(self, req: ChatRequest, res, prompt: Prompt, rows: int):
        """The reply's :class:`~attnprobe.generation.capturing.LoopCapture` (capture in the loop)."""
        from attnprobe.generation.capturing import LoopCapture

        cfg = getattr(self.loaded.model.config, "text_config", None) or self.loaded.model.config
        side = [LoopCapture(scorer=sc, token_ids=[int(t) for t in plan.ids], prefilled=ran)
                for (sc, ran), plan in zip(res.side, req.capture.before)]
        return LoopCapture(scorer=res.scorer, token_ids=list(prompt.ids) + res.new[:1], prefilled=res.prefilled,
                           side=side, info={"num_key_value_heads": getattr(cfg, "num_key_value_heads", None),
                                 "head_dim": getattr(cfg, "head_dim", None), "attention_calls": res.attention_calls,
                                 "batch_rows": rows})

    def end_episode(self, episode: str) -> None:
        """Free the episode's kept cache."""
        self._kept.pop(episode, None)

    def cut_at_call(self, new: list[int], names: list[str]) -> list[int]:
        """The shortest prefix of ``new`` whose text holds a complete call (the row's own stop point)."""
        for n in range(1, len(new) + 1):
            if n % self.stop_check_every == 0:
                text = self.tokenizer.decode(new[:n], skip_special_tokens=True)
                if ("}" in text or ")" in text or "</function>" in text) and parse_tool_calls(text, names)[1]:
                    return new[:n]
        return new

    def make_reply(self, prompt: Prompt, new: list[int], tools: list[dict] | None, max_new_tokens: int,
                   messages: list[dict], no_call: bool = False) -> ChatReply:
        """The :class:`ChatReply` of ``new`` token ids after ``prompt``: parsed calls, ids, stop reason."""
        tok = self.tokenizer
        text = tok.decode(new, skip_special_tokens=True)
        content, calls = parse_tool_calls(text, tool_names(tools))
        ids = call_ids(messages, len(calls), self.call_prefix)
        tool_calls = [c.to_openai(i) for c, i in zip(calls, ids)]
        eos = tok.eos_token_id
        if no_call:
            stopped_by = "no_call"
        elif new and eos is not None and new[-1] == eos:
            stopped_by = "eos"
        elif len(new) >= max_new_tokens:
            stopped_by = "length"
        else:
            stopped_by = "other"
        finish = "tool_calls" if tool_calls else ("length" if len(new) >= max_new_tokens else "stop")
        return ChatReply(content=content if tool_calls else text.strip(), tool_calls=tool_calls, raw_text=text,
                         input_tokens=len(prompt.ids), output_tokens=len(new), finish_reason=finish,
                         stopped_by=stopped_by, prompt=prompt)

    # ------------------------------------------------------------------ scoring
    def option_logprobs(self, prompt_ids: Sequence[int], options: Sequence[str], *, prefix: str = "",
                        suffix: str = "") -> dict[str, float]:
        """Summed log-probability of each option's tokens after the prompt + ``prefix`` (the text of
        an option is ``prefix + option + suffix``; the prefix is given, not scored).

        One prefill: the prompt + prefix is run once and its KV cache is reused for every option
        (each option's tokens are cropped off the cache before the next). If the tokenizer merges
        across the prefix boundary, every option is scored from scratch instead, prefix included.
        """
        import torch

        from attnprobe_hooks.transformers.prefill import cache_kw

        tok, model, dev = self.tokenizer, self.loaded.model, self._device()

        def tensor(x):
            t = torch.as_tensor(x)
            return t.to(dev) if dev is not None else t

        pre = tok(prefix, add_special_tokens=False)["input_ids"] if prefix else []
        full = {o: tok(prefix + o + suffix, add_special_tokens=False)["input_ids"] for o in options}
        if any(full[o][:len(pre)] != pre for o in options):
            return self._option_logprobs_plain(prompt_ids, full)
        tails = {o: full[o][len(pre):] for o in options}
        out: dict[str, float] = {}
        with torch.inference_mode():
            first = model(tensor(list(prompt_ids) + pre)[None], use_cache=True)
            keys = set(first.keys())  # transformers >= 5.2x names it "cache", older "past_key_values"
            cache = first["cache"] if "cache" in keys else getattr(first, "past_key_values", None)
            if cache is None:
                return self._option_logprobs_plain(prompt_ids, full)
            last = torch.log_softmax(first.logits[0, -1].float(), dim=-1)
            added = 0
            for o in options:
                if added:  # drop the previous option's tokens from the shared cache
                    cache.crop(-added)
                    added = 0
                ids = tails[o]
                lp = float(last[ids[0]])
                if len(ids) > 1:
                    kw = {cache_kw(model): cache}
                    logits = model(tensor(ids[:-1])[None], use_cache=True, **kw).logits[0].float()
                    logp = torch.log_softmax(logits, dim=-1)
                    lp += float(logp[tensor(range(len(ids) - 1)), tensor(ids[1:])].sum())
                    added = len(ids) - 1
                out[o] = lp
        return out

    def _option_logprobs_plain(self, prompt_ids, full: dict[str, list[int]]) -> dict[str, float]:
        import torch

        dev = self._device()
        out = {}
        for o, cont in full.items():
            ids = torch.as_tensor(list(prompt_ids) + list(cont))[None]
            idx = torch.as_tensor(cont)[:, None]
            if dev is not None:
                ids, idx = ids.to(dev), idx.to(dev)
            with torch.inference_mode():
                logits = self.loaded.model(ids).logits[0, len(prompt_ids) - 1:-1].float()
            out[o] = float(torch.log_softmax(logits, dim=-1).gather(1, idx).sum())
        return out
