"""The hand-written decode loop behind :meth:`TransformersChat.complete_batch` (issue 30).

``model.generate`` cannot start rows from caches of different lengths nor mask each row's logits with its
own grammar, so the batch is decoded here:

1. **Prefill per row.** Each row runs only its new suffix on its own batch-1 cache: a kept cache (the
   episode's previous turn, cropped to the longest common prefix with the new prompt, at most
   ``len(prompt) - 1`` so that the last prompt token is always run for its logits) or an empty one. One
   row alone is the same forward ``generate`` runs for one prompt (``logits_to_keep=1`` included).
2. **Stitch.** The rows' caches are left-padded (zeros, masked out) into one batch cache; positions are
   explicit (each row's own), so a row's keys and RoPE phases are those of its unpadded sequence.
3. **Decode.** One forward per step for the active rows; per row: repetition penalty (when the model's
   generation config sets one), its grammar's mask, greedy argmax or temperature/top-k/top-p sampling
   (the order ``generate`` applies them), then its stop rules, checked as :meth:`TransformersChat.complete`
   checks them. A finished row leaves the batch at once (its cache is split off; the leading columns no
   active row needs are dropped).
4. **Split.** Each row's cache (prompt + all generated tokens but the last, which was never fed) comes back
   with the token ids it covers, for the next turn of its episode.

Stop rules per row, after each new token, in this order: a complete call of the row's stop names (checked
every ``every`` tokens, as ``complete``), the no-call budget, the grammar finished, an end-of-sequence id
(the generation config's, as ``generate``), the row's ``max_new_tokens``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from attnprobe.generation.toolparse import parse_tool_calls

KV = list[tuple[Any, Any]]  # per layer (keys, values), each [1, kv heads, tokens, head dim]


@dataclass
class Row:
    """One request of a batch, as the loop needs it."""

    ids: list[int]  # the prompt's token ids
    max_new_tokens: int
    temperature: float = 0.0
    stop_names: list[str] = field(default_factory=list)  # complete-call stop (empty: off)
    state: Any = None  # a grammar RowState (attnprobe.generation.structured) or None
    generator: Any = None  # torch.Generator for sampling (None: torch's global one)
    kept: KV | None = None  # the episode's cache from its previous turn
    kept_ids: list[int] = field(default_factory=list)  # the token ids that cache covers
    capture: Any = None  # a CaptureSpec (attnprobe.generation.capturing): score while generating


@dataclass
class RowResult:
    new: list[int]  # the generated token ids
    reason: str  # "call" | "no_call" | "grammar" | "eos" | "length"
    cache: KV | None  # prompt + new[:-1] (None when nothing is kept)
    cache_ids: list[int]
    prefilled: int  # prompt tokens run (the rest came from the kept cache)
    scorer: Any = None  # the row's QueryScorer on the host (capture in the loop), else None
    attention_calls: int = 0  # attention calls that scored the row (prefill and its reply-start step)
    side: list = field(default_factory=list)  # per side plan (scorer on the host, tokens run)


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def reusable(row: Row) -> int:
    """Prompt tokens the kept cache supplies: the common prefix, leaving the last prompt token to run, and
    (capture in the loop) no position the capture must score: those are computed in this call."""
    if not row.kept:
        return 0
    n = min(common_prefix(row.kept_ids, row.ids), len(row.ids) - 1, kv_length(row.kept))
    if row.capture is not None and row.capture.positions:
        n = min(n, int(row.capture.positions[0]))
    return n


def new_scorer(row: Row):
    """The empty :class:`QueryScorer` of a capturing row: its positions and the reply start, per-key
    segments unless the spec gives its own (:meth:`CaptureSpec.segments`)."""
    import torch

    from attnprobe_hooks.scoring import QueryScorer

    seg, count = row.capture.segments(len(row.ids))
    return QueryScorer(seg_ids=torch.as_tensor(seg), num_segments=count,
                       query_positions=torch.as_tensor(row.capture.query_positions(len(row.ids))),
                       layers=None if row.capture.layers is None else list(row.capture.layers))


def kv_length(kv: KV) -> int:
    return int(kv[0][0].shape[-2]) if kv else 0


class Unsupported(Exception):
    """The model's cache is not a plain per-layer key/value cache (e.g. a recurrent or hybrid model)."""


@dataclass
class StopRules:
    tokenizer: Any
    every: int  # check for a complete call every N new tokens
    budget: int | None  # the no-call budget (None: off)
    eos_ids: frozenset[int]
    opens_call: Callable[[str, list[str]], bool]  # transformers_chat.opens_call (the no-call budget's test)

    def reason(self, row: Row, new: list[int]) -> str | None:
        n = len(new)
        check_call = bool(row.stop_names) and n % self.every == 0
        check_budget = self.budget is not None and n == self.budget
        if check_call or check_budget:
            text = self.tokenizer.decode(new, skip_special_tokens=True)
            if check_call and ("}" in text or ")" in text or "</function>" in text) and parse_tool_calls(text, row.stop_names)[1]:
                return "call"
            if check_budget and not self.opens_call(text, row.stop_names):
                return "no_call"
        if row.state is not None and row.state.finished:
            return "grammar"
        if new[-1] in self.eos_ids:
            return "eos"
        if n >= row.max_new_tokens:
            return "length"
        return None


@dataclass
class Sampling:
    """What the model's generation config adds to plain greedy/temperature decoding (as ``generate``)."""

    repetition_penalty: float | None = None
    top_k: int | None = None
    top_p: float | None = None

    @classmethod
    def of(cls, model) -> Sampling:
        cfg = getattr(model, "generation_config", None)
        rp = getattr(cfg, "repetition_penalty", None)
        top_k = getattr(cfg, "top_k", None)
        top_p = getattr(cfg, "top_p", None)
        return cls(repetition_penalty=rp if rp not in (None, 1.0) else None,
                   top_k=int(top_k) if top_k else None, top_p=float(top_p) if top_p not in (None, 1.0) else None)


def _choose(logits, rows: list[Row], seen: list[list[int]], sampling: Sampling) -> list[int]:
    """One token per row from ``logits`` [rows, vocab] (float32)."""
    import torch

    out = []
    constrained = [i for i, r in enumerate(rows) if r.state is not None]
    if constrained and sampling.repetition_penalty is None:  # every constrained row masked in one operation
        allowed = torch.from_numpy(_allowed_rows([rows[i].state for i in constrained], logits.shape[-1]))
        idx = torch.as_tensor(constrained, device=logits.device)
        logits = logits.clone()
        logits[idx] = logits[idx].masked_fill(~allowed.to(logits.device), float("-inf"))
        masked = set(constrained)
    else:
        masked = set()
    if sampling.repetition_penalty is None and all(r.temperature <= 0 for r in rows):
        return logits.argmax(dim=-1).tolist()
    for i, row in enumerate(rows):
        x = logits[i]
        if sampling.repetition_penalty is not None:  # as transformers' RepetitionPenaltyLogitsProcessor
            idx = torch.as_tensor(seen[i], device=x.device)
            s = x.gather(0, idx)
            x = x.scatter(0, idx, torch.where(s < 0, s * sampling.repetition_penalty, s / sampling.repetition_penalty))
        if row.state is not None and i not in masked:
            allowed = row.state.allowed(x.shape[-1]).to(x.device)
            x = x.masked_fill(~allowed, float("-inf"))
        if row.temperature <= 0:
            out.append(int(x.argmax()))
            continue
        x = x / row.temperature
        if sampling.top_k is not None and sampling.top_k < x.shape[-1]:
            kth = torch.topk(x, sampling.top_k).values[-1]
            x = x.masked_fill(x < kth, float("-inf"))
        if sampling.top_p is not None:
            sorted_x, order = torch.sort(x, descending=False)
            cum = sorted_x.softmax(-1).cumsum(-1)
            drop = cum <= (1 - sampling.top_p)
            drop[-1] = False
            x = x.masked_fill(drop.scatter(0, order, drop), float("-inf"))
        probs = x.softmax(-1)
        out.append(int(torch.multinomial(probs, 1, generator=row.generator)))
    return out


def _forward_kwargs(model) -> tuple[str, bool]:
    from attnprobe_hooks.transformers.prefill import cache_kw

    try:
        keep = "logits_to_keep" in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        keep = False
    return cache_kw(model), keep


def _layers(cache) -> list:
    layers = getattr(cache, "layers", None)
    if not layers or not all(getattr(layer, "keys", None) is not None and getattr(layer.keys, "dim", None)
                             and layer.keys.dim() == 4 for layer in layers):
        raise Unsupported(f"{type(cache).__name__} is not a per-layer key/value cache")
    return layers


def prefill(model, row: Row, reuse: int, scorer=None):
    """Run ``row.ids[reuse:]`` on the row's kept cache cropped to ``reuse`` tokens; (cache, last logits).
    ``scorer``: score its prompt positions in this forward (against every key: the kept ones and the new)."""
    import torch
    from transformers import DynamicCache

    if scorer is not None:
        from attnprobe_hooks.transformers.attention import CaptureState, PlanTarget, active

        state = CaptureState(targets=[(PlanTarget(scorer=scorer), len(row.ids))], chunk_start=reuse)
        with active(state):
            out = prefill(model, row, reuse)
        return (*out, state.calls)

    kw_name, keep = _forward_kwargs(model)
    dev = getattr(model, "device", None)
    cache = DynamicCache(ddp_cache_data=[(k[:, :, :reuse], v[:, :, :reuse]) for k, v in row.kept]) \
        if reuse else DynamicCache()
    ids = torch.as_tensor(row.ids[reuse:], device=dev)[None]
    kw = {kw_name: cache, "use_cache": True}
    if keep:
        kw["logits_to_keep"] = 1
    out = model(input_ids=ids, attention_mask=torch.ones(1, len(row.ids), dtype=torch.long, device=dev),
                position_ids=torch.arange(reuse, len(row.ids), device=dev)[None], **kw)
    _layers(cache)
    return cache, out.logits[0, -1].float()


def stitch(caches: list) -> tuple[Any, Any]:
    """Left-pad batch-1 caches into one batch cache; (cache, attention mask [rows, width])."""
    import torch
    from transformers import DynamicCache

    lens = [int(_layers(c)[0].keys.shape[-2]) for c in caches]
    width = max(lens)
    first = _layers(caches[0])
    data = []
    for li in range(len(first)):
        k0 = first[li].keys
        ks = k0.new_zeros((len(caches), k0.shape[1], width, k0.shape[3]))
        vs = first[li].values.new_zeros((len(caches), first[li].values.shape[1], width, first[li].values.shape[3]))
        for r, c in enumerate(caches):
            layer = c.layers[li]
            ks[r, :, width - lens[r]:] = layer.keys[0]
            vs[r, :, width - lens[r]:] = layer.values[0]
        data.append((ks, vs))
    mask = torch.zeros(len(caches), width, dtype=torch.long, device=first[0].keys.device)
    for r, n in enumerate(lens):
        mask[r, width - n:] = 1
    return DynamicCache(ddp_cache_data=data), mask


def split_row(cache, mask, i: int) -> KV:
    """Row ``i``'s own tokens out of the batch cache (copies, so the batch can be freed)."""
    real = int(mask[i].sum())
    return [(layer.keys[i:i + 1, :, -real:].clone(), layer.values[i:i + 1, :, -real:].clone())
            for layer in cache.layers]


def keep_rows(cache, mask, idx: list[int]):
    """The batch cache and mask for rows ``idx`` only, without the leading columns none of them uses."""
    import torch

    sel = torch.as_tensor(idx, device=mask.device)
    mask = mask.index_select(0, sel)
    lead = int((mask.sum(0) == 0).long().cumprod(0).sum())  # columns padded in every kept row
    for layer in cache.layers:
        layer.keys = layer.keys.index_select(0, sel)[:, :, lead:]
        layer.values = layer.values.index_select(0, sel)[:, :, lead:]
    return cache, mask[:, lead:]


def side_plan(model, row: Row, plan) -> tuple[Any, int]:
    """Score a :class:`~attnprobe.generation.capturing.SidePlan` on the row's kept cache (its shared prefix is
    not run again; the cache is left as it was): (scorer on the host, tokens run)."""
    import torch

    from attnprobe_hooks.scoring import QueryScorer

    ids = [int(t) for t in plan.ids]
    n = len(ids)
    kept = Row(ids=ids, max_new_tokens=1, kept=row.kept, kept_ids=row.kept_ids)
    reuse = min(reusable(kept), int(plan.positions[0])) if plan.positions else reusable(kept)
    scorer = QueryScorer(seg_ids=torch.arange(n), num_segments=n, query_positions=torch.as_tensor(plan.positions),
                         layers=None if row.capture.layers is None else list(row.capture.layers))
    prefill(model, kept, reuse, scorer)
    return scorer.to_host(), n - reuse


def _feed_first(model, kv: KV, row: Row, token: int, scorer) -> int:
    """Capture in the loop for a reply that ended at its first token (never fed back in the batch): feed it
    alone on the row's own cache (batch 1, no padding) and score its query; the number of attention calls."""
    import torch
    from transformers import DynamicCache

    from attnprobe_hooks.transformers.attention import StepRow, StepState, stepping

    kw_name, keep_logits = _forward_kwargs(model)
    dev = kv[0][0].device
    n = len(row.ids)
    state = StepState([StepRow(scorer, 0, len(scorer.qpos) - 1, n + 1)])
    kw = {kw_name: DynamicCache(ddp_cache_data=list(kv)), "use_cache": True}
    if keep_logits:
        kw["logits_to_keep"] = 1
    with stepping(state):
        model(input_ids=torch.as_tensor([[token]], device=dev), attention_mask=torch.ones(1, n + 1, dtype=torch.long,
              device=dev), position_ids=torch.as_tensor([[n]], device=dev), **kw)
    return state.calls


def decode(model, rows: list[Row], rules: StopRules, *, keep: list[bool]) -> list[RowResult]:
    """Generate for every row (see the module docstring); ``keep[r]``: return row r's cache. A row with a
    ``capture`` spec is scored as it runs (:mod:`attnprobe.generation.capturing`): its positions in its
    prefill, its reply's first token in the decode step that feeds it (its own keys only: the batch's
    left padding is cut off), and its :class:`RowResult` carries the scorer."""
    import torch

    kw_name, keep_logits = _forward_kwargs(model)
    sampling = Sampling.of(model)
    reuse = [reusable(r) for r in rows]
    scorers = [new_scorer(r) if r.capture is not None else None for r in rows]
    calls = [0] * len(rows)
    if any(sc is not None for sc in scorers):
        from attnprobe_hooks.transformers.attention import install

        install(model)  # the scoring attention function (a plain pass-through while nothing is scored)
    side = [[side_plan(model, row, plan) for plan in row.capture.before] if row.capture is not None else []
            for row in rows]  # on the kept caches, before the prefills crop them
    caches, first = [], []
    for r, (row, n) in enumerate(zip(rows, reuse)):
        if scorers[r] is not None:
            c, lg, calls[r] = prefill(model, row, n, scorers[r])
        else:
            c, lg = prefill(model, row, n)
        caches.append(c)
        first.append(lg)
        row.kept = None  # the cropped slice now lives in the new cache; let the old one go
    cache, mask = stitch(caches)
    del caches
    logits = torch.stack(first)
    new: list[list[int]] = [[] for _ in rows]
    results: list[RowResult | None] = [None] * len(rows)
    active = list(range(len(rows)))
    while True:
        toks = _choose(logits, [rows[r] for r in active], [rows[r].ids + new[r] for r in active], sampling)
        still = []
        for i, (r, t) in enumerate(zip(active, toks)):
            new[r].append(t)
            if rows[r].state is not None:
                rows[r].state.accept(t)
            why = rules.reason(rows[r], new[r])
            if why is None:
                still.append(i)
                continue
            first_only = scorers[r] is not None and len(new[r]) == 1 and rows[r].capture.reply_start  # never fed back
            kv = split_row(cache, mask, i) if keep[r] or first_only else None
            if first_only:
                calls[r] += _feed_first(model, kv, rows[r], t, scorers[r])
            results[r] = RowResult(new=new[r], reason=why, cache=kv if keep[r] else None,
                                   cache_ids=rows[r].ids + new[r][:-1], prefilled=len(rows[r].ids) - reuse[r])
        if not still:
            break
        if len(still) < len(active):
            cache, mask = keep_rows(cache, mask, still)
            active = [active[i] for i in still]
            toks = [toks[i] for i in still]
        dev = mask.device
        mask = torch.cat([mask, mask.new_ones((len(active), 1))], dim=1)
        pos = torch.as_tensor([[len(rows[r].ids) + len(new[r]) - 1] for r in active], device=dev)
        kw = {kw_name: cache, "use_cache": True}
        if keep_logits:
            kw["logits_to_keep"] = 1
        step = _first_step_rows(rows, active, new, scorers, mask)
        if step is None:
            out = model(input_ids=torch.as_tensor(toks, device=dev)[:, None], attention_mask=mask, position_ids=pos,
                        **kw)
        else:
            from attnprobe_hooks.transformers.attention import stepping

            with stepping(step):
                out = model(input_ids=torch.as_tensor(toks, device=dev)[:, None], attention_mask=mask,
                            position_ids=pos, **kw)
            for s in step.rows:
                calls[active[s.batch_row]] += step.calls
        logits = out.logits[:, -1].float()
    for r, sc in enumerate(scorers):
        if sc is not None:
            results[r].scorer, results[r].attention_calls, results[r].side = sc.to_host(), calls[r], side[r]
    return results  # type: ignore[return-value]


def _first_step_rows(rows: list[Row], active: list[int], new: list[list[int]], scorers: list, mask):
    """The :class:`StepState` of a decode step that feeds capturing rows their reply's first token (every
    active row gets its first token in the same step), None when no row is scored in it. A row's own keys
    are its real columns of ``mask`` (left padding excluded): its prompt and the fed token."""
    from attnprobe_hooks.transformers.attention import StepRow, StepState

    todo = []
    for i, r in enumerate(active):
        if scorers[r] is None or len(new[r]) != 1 or not rows[r].capture.reply_start:
            continue
        keys = int(mask[i].sum())
        if keys != len(rows[r].ids) + 1:
            raise RuntimeError(f"capture in the loop: row {r} has {keys} keys at its first decode step, expected "
                               f"{len(rows[r].ids) + 1}")
        todo.append(StepRow(scorers[r], i, len(scorers[r].qpos) - 1, keys))
    return StepState(todo) if todo else None


def _allowed_rows(states, vocab_size: int):
    """The allowed tokens of several grammar rows as one bool array (:func:`attnprobe.generation.structured.
    allowed_rows`); a row state without it (a test's own) is asked row by row."""
    import numpy as np

    from attnprobe.generation.structured import RowState, allowed_rows

    if all(isinstance(s, RowState) for s in states):
        return allowed_rows(states, vocab_size)
    return np.stack([np.asarray(s.allowed(vocab_size), dtype=bool) for s in states])


def token_constraint(tokenizer, fmt):
    """The grammar of ``fmt`` (an :class:`~attnprobe.generation.chat.ActionFormat`) as a token constraint:
    :func:`attnprobe.generation.structured.token_constraint` (imported here, lazily, so decoding without
    ``actions`` never loads it). Its ``start()`` gives a row state with
    ``allowed(vocab_size) -> BoolTensor``, ``accept(token_id)`` and ``finished``."""
    from attnprobe.generation.structured import token_constraint as constraint

    return constraint(tokenizer, fmt)
