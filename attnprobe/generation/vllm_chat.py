"""Generation with vLLM's offline engine in process (``--generator vllm``).

- The engine is built from the capture backend's engine options (tensor parallel, chunk size, KV cache
  size, ... :func:`attnprobe_hooks.vllm.backend.open_engine`, docs/vllm.md), without the capture
  hooks and with automatic prefix caching on: a turn whose prompt extends the last one (or shares a
  long prefix with another episode's) prefills only what is new. On CPU the engine runs eagerly (no
  graph compilation: it starts in seconds); on GPU vLLM's defaults apply. ``engine_kwargs`` overrides.
- Prompts are rendered by :func:`attnprobe.render.rendering.render` with ``add_generation_prompt=True``,
  exactly as :class:`~attnprobe.generation.transformers_chat.TransformersChat` renders them, and sent as
  token ids, so a recorded call can be captured later with identical tokens.
- :meth:`VllmChat.complete_batch` sends the whole batch in one ``llm.generate``, each request with its
  own ``SamplingParams`` (``max_tokens``: vLLM's name for ``max_new_tokens``; temperature; greedy at 0). A request with ``actions`` adds the
  engine's structured-output options (:func:`attnprobe.generation.structured.vllm_sampling_params_kwargs`).
- Stop at call: the same rule as TransformersChat (on when tools are offered), applied after the fact.
  The engine generates up to its end-of-sequence token or ``max_new_tokens``; the reply is then cut to the
  shortest prefix, checked every ``stop_check_every`` tokens, whose text holds a complete call, which
  is exactly where TransformersChat's stopping criterion would have ended it. (A vLLM ``stop`` string
  cannot say "a complete JSON call"; the cost is the tokens generated past the call.)
- Token accounting: ``stats`` counts prompt tokens sent, those the prefix cache served
  (``RequestOutput.num_cached_tokens``), those prefilled (sent - cached) and tokens the engine generated
  (before the stop-at-call cut; a reply's ``output_tokens`` counts after it), over the object's life; ``last_batch`` holds the per-request counts of the last batch.

- Capture in the loop (issue 40, :mod:`attnprobe.generation.capturing`): opened with ``capture=True``, the
  generation engine carries the capture extension (eager, vLLM's V1 model runner), so ONE engine generates
  and captures: a request with ``capture`` is scored while it runs (its listed prompt positions in its
  prefill, the reply's first token at the decode step that feeds it back; against every key of its context,
  keys its prefix-cache hit skipped included) by :func:`attnprobe_hooks.vllm.generate.generate`, and the
  reply's ``capture`` holds the scores (docs/vllm.md, "Capture while generating").

The replies (content, parsed calls with ids ``call1``, ..., ``stopped_by``, ``finish_reason``, the
prompt) are built by the same code as TransformersChat's, so greedy replies compare token for token.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from attnprobe.errors import AttnprobeError
from attnprobe.generation.chat import DEFAULT_MAX_NEW_TOKENS, ChatReply, ChatRequest, OneByOne, request_prompt
from attnprobe.generation.transformers_chat import TransformersChat


def structured():
    """:mod:`attnprobe.generation.structured` (the action grammars), imported only when a request asks for
    structured actions."""
    import attnprobe.generation.structured as module

    return module


class VllmChat(OneByOne):
    """Chat completions from a vLLM engine in this process (see the module docstring).

    ``loaded``: a :class:`attnprobe_hooks.vllm.backend.VllmModel` (:meth:`open` builds one);
    ``stop_at_call``: as for TransformersChat (None: stop at a complete call when tools are offered).
    """

    kind = "vllm"

    def __init__(self, loaded, *, stop_at_call: bool | None = None, stop_check_every: int = 4,
                 retain_tokens: int | None = None):
        self.loaded = loaded
        self.captures = bool(getattr(loaded, "ranks", None))  # the engine carries the capture extension
        self.retain_tokens = retain_tokens
        self.name = loaded.name
        self.tokenizer = loaded.tokenizer
        # Prompt rendering, stop names, cutting and reply building: TransformersChat's own code, so the
        # two in-process generators cannot drift apart.
        self._text = TransformersChat(loaded, stop_at_call=stop_at_call, stop_check_every=stop_check_every)
        self.stats = {"calls": 0, "sent": 0, "cached": 0, "prefilled": 0, "generated": 0}
        self.last_batch: list[dict[str, int]] = []

    @classmethod
    def open(cls, spec: str = "default", *, dtype: str = "float32", stop_at_call: bool | None = None,
             engine_kwargs: dict | None = None, capture: bool = False, retain_tokens: int | None = None,
             **engine: Any) -> VllmChat:
        """Build (or reuse) the generation engine for ``spec``; ``engine``: the capture backend's engine
        options (``tensor_parallel_size``, ``chunk_size``, ``max_model_len``, ``kv_cache_gib``,
        ``gpu_memory_utilization``, ``max_num_seqs``, ``seed``, ``progress``). ``capture``: the engine
        carries the capture extension, so requests with ``capture`` are scored as they run (eager on every
        device: the hooks do not fire inside captured graphs); ``retain_tokens``: positions of finished
        captured requests each rank keeps to serve later prefix-cache hits (default
        :data:`attnprobe_hooks.vllm.generate.DEFAULT_RETAIN_TOKENS`)."""
        from attnprobe_hooks.backend import DEFAULT_CHUNK_SIZE
        from attnprobe_hooks.vllm.backend import open_engine, require_vllm

        require_vllm()
        from vllm.platforms import current_platform

        chunk = int(engine.get("chunk_size") or DEFAULT_CHUNK_SIZE)
        engine["chunk_size"] = chunk
        defaults = {"enable_chunked_prefill": True, "max_num_batched_tokens": chunk,
                    "enforce_eager": bool(current_platform.is_cpu())}
        forced: dict[str, Any] = {"enable_prefix_caching": True}
        if capture:
            import os

            from attnprobe_hooks.vllm.extension import EXTENSION

            os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "0")  # request bookkeeping binds requests to plans
            forced.update(enforce_eager=True, worker_extension_cls=EXTENSION)
        loaded = open_engine(spec, dtype=dtype, engine_kwargs=engine_kwargs, defaults=defaults, forced=forced,
                             purpose="generate+capture" if capture else "generate", **engine)
        if capture and loaded.ranks is None:
            loaded.ranks = loaded.model.collective_rpc("attnprobe_install")
            loaded.attn_implementation = "vllm-prehook"
        return cls(loaded, stop_at_call=stop_at_call, retain_tokens=retain_tokens)

    def close(self) -> None:
        from attnprobe_hooks.vllm.backend import unload

        unload(self.loaded)

    # ------------------------------------------------------------------ generation
    def prompt(self, messages: list[dict], tools: list[dict] | None = None):
        """The prompt as TransformersChat renders it (ids, text, rendering)."""
        return self._text.prompt(messages, tools)

    def complete(self, messages: list[dict], tools: list[dict] | None = None, *, max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
                 temperature: float = 0.0) -> ChatReply:
        return self.complete_batch([ChatRequest(messages, tools, max_new_tokens=max_new_tokens, temperature=temperature)])[0]

    def _params(self, request: ChatRequest):
        from vllm import SamplingParams

        kw: dict[str, Any] = {"max_tokens": int(request.max_new_tokens), "temperature": float(request.temperature),
                              "detokenize": False}
        if request.actions is not None:
            kw.update(structured().vllm_sampling_params_kwargs(request.actions))
        return SamplingParams(**kw)

    def complete_batch(self, requests: Sequence[ChatRequest]) -> list[ChatReply]:
        """All requests in one ``llm.generate`` (the engine schedules and batches them); replies in order."""
        from vllm.inputs import TokensPrompt

        requests = list(requests)
        if not requests:
            return []
        llm = self.loaded.model
        if llm is None:
            raise AttnprobeError("this vLLM generator was closed; open it again")
        prompts = [request_prompt(r, self.prompt, self.tokenizer) for r in requests]
        limit = self.loaded.max_model_len
        for i, p in enumerate(prompts):
            if limit is not None and len(p.ids) >= limit:
                raise AttnprobeError(f"request {i + 1}: the prompt renders to {len(p.ids)} tokens; the vLLM engine "
                                     f"holds at most {limit - 1} prompt tokens (max_model_len={limit})")
        captures: list = [None] * len(requests)
        if any(r.capture is not None for r in requests):
            outputs, captures = self._generate_capturing(requests, prompts)
        else:
            outputs = llm.generate([TokensPrompt(prompt_token_ids=p.ids) for p in prompts],
                                   [self._params(r) for r in requests], use_tqdm=False)
        replies, batch = [], []
        for r, p, out, cap in zip(requests, prompts, outputs, captures):
            new = engine_new = [int(t) for t in out.outputs[0].token_ids]
            names = self._text.stop_names_for(r.tools)
            if names:
                new = self._text.cut_at_call(new, names)
            replies.append(self._text.make_reply(p, new, r.tools, r.max_new_tokens, r.messages))
            if cap is not None:
                replies[-1].capture = cap
            cached = int(getattr(out, "num_cached_tokens", 0) or 0)
            batch.append({"sent": len(p.ids), "cached": cached, "prefilled": len(p.ids) - cached,
                          "generated": len(engine_new)})
        self.last_batch = batch
        for row in batch:
            self.stats["calls"] += 1
            for key, n in row.items():
                self.stats[key] += n
        return replies

    def _generate_capturing(self, requests: Sequence[ChatRequest], prompts: list) -> tuple[list, list]:
        """One ``llm.generate`` on the engine that captures: the requests with ``capture`` scored as they run
        (:func:`attnprobe_hooks.vllm.generate.generate`), their side plans (``CaptureSpec.before``) as requests
        of one new token in the same batch (per-key rows; the keys of a prefix their prompt shares with an
        earlier request come from the prefix cache); their :class:`LoopCapture` in request order.

        A spec with nothing to score (no positions, no reply start) gets an empty scorer."""
        import torch
        from vllm import SamplingParams

        from attnprobe.generation.capturing import LoopCapture
        from attnprobe_hooks.scoring import QueryScorer
        from attnprobe_hooks.vllm import generate as live

        if not self.captures:
            raise AttnprobeError("this vLLM generator cannot capture while generating: open it with capture=True")
        asks, sides = [], []
        for r, p in zip(requests, prompts):
            spec = r.capture
            item = live.LiveRequest(prompt=list(p.ids), params=self._params(r))
            if spec is not None:
                seg, count = spec.segments(len(p.ids))
                item.positions, item.reply_start = list(spec.positions), bool(spec.reply_start)
                item.segments, item.num_segments = seg, count
                item.layers = None if spec.layers is None else list(spec.layers)
            asks.append(item)
        one = SamplingParams(max_tokens=1, temperature=0.0, detokenize=False)
        for i, r in enumerate(requests):
            for plan in (r.capture.before if r.capture is not None else ()):
                ids = [int(t) for t in plan.ids]
                asks.append(live.LiveRequest(prompt=ids, params=one, positions=[int(x) for x in plan.positions],
                                             reply_start=False, segments=list(range(len(ids))),
                                             num_segments=len(ids), layers=asks[i].layers))
                sides.append((i, ids))
        kw = {} if self.retain_tokens is None else {"retain_tokens": int(self.retain_tokens)}
        outputs, results = live.generate(self.loaded, asks, **kw)
        cfg = self.loaded._text_config
        notes = {"num_key_value_heads": getattr(cfg, "num_key_value_heads", None),
                 "head_dim": self.loaded.ranks[0]["head_dim"]}
        caps: list[LoopCapture | None] = []
        for r, p, out, res in zip(requests, prompts, outputs, results):
            if r.capture is None:
                caps.append(None)
            elif res is None:  # nothing to score: an empty scorer over the call's keys
                seg, count = r.capture.segments(len(p.ids))
                empty = QueryScorer(seg_ids=torch.as_tensor(seg), num_segments=count,
                                    query_positions=torch.zeros(0, dtype=torch.long),
                                    layers=None if r.capture.layers is None else list(r.capture.layers))
                caps.append(LoopCapture(scorer=empty, token_ids=[*p.ids, int(out.outputs[0].token_ids[0])],
                                        prefilled=len(p.ids) - int(getattr(out, "num_cached_tokens", 0) or 0),
                                        info=dict(notes)))
            else:
                caps.append(LoopCapture(scorer=res.scorer, token_ids=res.token_ids, prefilled=res.prefilled,
                                        info={**res.info, **notes}))
        for (i, ids), res in zip(sides, results[len(requests):]):
            if res is None:
                raise AttnprobeError(f"request {i + 1}: a side plan of {len(ids)} tokens scores no position")
            caps[i].side.append(LoopCapture(scorer=res.scorer, token_ids=ids, prefilled=res.prefilled,
                                            info={**res.info, **notes}))
        return outputs[: len(requests)], caps

    def end_episode(self, episode: str) -> None:
        """Nothing to free: the engine's prefix cache is shared by all episodes and evicts by itself."""
        return None
