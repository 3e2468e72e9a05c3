"""The worker side of the vLLM backend: the RPC surface vLLM mixes into every worker.

vLLM runs the model in worker processes (one per tensor-parallel rank, or in-process). We reach
them through vLLM's worker-extension mechanism: ``LLM(..., worker_extension_cls=EXTENSION)`` makes
every worker inherit :class:`AttnprobeWorkerExtension`, and ``llm.collective_rpc("attnprobe_...")``
calls its methods on every rank. Nothing is pickled: the class is imported by name in each worker,
plans go in as plain lists and dicts, results come back as safetensors bytes plus a JSON-able dict.

Inside a worker:

- a forward pre-hook on the model (``runner.get_model()``) records the flat ``input_ids`` and
  ``positions`` of the step;
- a forward pre-hook on every softmax-attention layer (vLLM's ``Attention`` module, found by
  :mod:`attnprobe_hooks.vllm.layers`) reads the flat post-RoPE ``query [tokens, local_heads*head_dim]``
  and ``key [tokens, local_kv_heads*head_dim]`` before the kernel runs. On the first layer of a step
  the step is sliced into requests with the attention metadata (``query_start_loc``) and each slice
  is matched to a capture plan (:func:`attnprobe_hooks.vllm.plan.match_step`); each plan then buffers
  its keys and scores its query rows (:meth:`attnprobe_hooks.vllm.plan.Plan.observe_layer`).

Tensor parallelism: each rank holds ``H/tp`` query heads and ``max(1, KVH/tp)`` KV heads. A rank
scores its own query heads against its own KV heads and reports them at their global head index
(``rank * local_heads``); the driver places the shards. Each query head is scored on exactly one
rank, so KV heads replicated over ranks (tp > KVH) are never counted twice; for saved keys only
the first replica of a KV head is kept. ``head_dim`` is the module's ``head_size``, which vLLM
takes from the config's ``head_dim`` (not ``hidden_size // heads``).

vLLM is imported only inside methods, so this module imports (and its import string can be
checked) without vLLM.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from attnprobe_hooks.vllm.layers import LayerInfo, find_attention_layers, tp_info
from attnprobe_hooks.vllm.live import Retained
from attnprobe_hooks.vllm.plan import (
    Plan,
    StepSlice,
    arm_sharing,
    donor_order,
    match_step,
    query_start_loc,
    step_arrays,
)

EXTENSION = "attnprobe_hooks.vllm.extension.AttnprobeWorkerExtension"


def _request_bookkeeping(runner: Any) -> tuple[Any, Any] | None:
    """(the step's request ids in ``query_start_loc`` order, request id -> state with ``prompt_token_ids``),
    or None for a runner without them (vLLM's model runner V2): what binds requests to plans, which
    prefix-cache hits need."""
    req_ids = getattr(getattr(runner, "input_batch", None), "req_ids", None)
    requests = getattr(runner, "requests", None)
    return None if req_ids is None or requests is None else (req_ids, requests)


class _State:
    """Per-worker capture state (lives in the worker process, never leaves it)."""

    def __init__(self) -> None:
        self.handles: list[Any] = []
        self.layers: dict[int, LayerInfo] = {}  # id(module) -> info
        self.by_name: dict[str, LayerInfo] = {}
        self.skipped: list[dict] = []
        self.plans: dict[str, Plan] = {}
        self.step_inputs: tuple[torch.Tensor | None, torch.Tensor] | None = None
        self.step_map: list[StepSlice] | None = None
        self.bound: dict[str, str | None] = {}  # engine request id -> plan tag (None: not ours)
        self.rank = 0
        self.tp_size = 1
        self.show_progress = False
        self.bar: Any = None
        self.retained = Retained()  # live plans of earlier calls: donors for later prefix-cache hits

    @property
    def active(self) -> bool:
        return bool(self.plans)

    def info_for_layer(self, layer: int) -> LayerInfo:
        for info in self.layers.values():
            if info.layer == layer:
                return info
        raise KeyError(layer)

    def disarm(self) -> None:
        self.plans = {}
        self.bound = {}
        self.step_inputs, self.step_map = None, None
        if self.bar is not None:
            self.bar.close()
            self.bar = None


class AttnprobeWorkerExtension:
    """Mixed into vLLM's worker class (``worker_extension_cls``); called via ``collective_rpc``.

    Method names carry the ``attnprobe_`` prefix so they cannot clash with the worker's own.
    """

    # ------------------------------------------------------------------ helpers
    def _attnprobe_state(self) -> _State:
        st = getattr(self, "_attnprobe", None)
        if st is None:
            st = _State()
            self._attnprobe = st
        return st

    def _attnprobe_model(self) -> torch.nn.Module:
        runner = self.model_runner
        return runner.get_model() if hasattr(runner, "get_model") else runner.model

    # ------------------------------------------------------------------ RPC methods
    def attnprobe_install(self) -> dict:
        """Hook every softmax-attention layer (idempotent). Returns what was hooked and skipped."""
        st = self._attnprobe_state()
        if not st.handles:
            st.rank, st.tp_size = tp_info()
            model = self._attnprobe_model()
            total_kv = None
            try:
                total_kv = self.model_config.get_total_num_kv_heads()
            except Exception:  # the layer's own numbers are used instead
                pass
            found = find_attention_layers(model, st.rank, st.tp_size, total_kv)
            for module, info in found.modules:
                st.layers[id(module)] = info
                st.by_name[info.name] = info
                st.handles.append(module.register_forward_pre_hook(self._attnprobe_layer_hook, with_kwargs=True))
            st.skipped.extend(found.skipped)
            if not st.layers:
                raise RuntimeError("attnprobe found no softmax-attention layer (vLLM Attention) in the model")
            st.handles.append(model.register_forward_pre_hook(self._attnprobe_model_hook, with_kwargs=True))
        infos = sorted(st.layers.values(), key=lambda i: i.layer)
        first = infos[0]
        return {
            "rank": st.rank, "tp_size": st.tp_size,
            "binds_requests": _request_bookkeeping(getattr(self, "model_runner", None)) is not None,
            "attention_layers": [i.layer for i in infos],
            "skipped": st.skipped,
            "local_heads": first.num_heads, "local_kv_heads": first.num_kv_heads, "head_dim": first.head_dim,
            "head_offset": first.head_offset, "kv_head_offset": first.kv_head_offset,
            "total_heads": first.total_heads, "total_kv_heads": first.total_kv_heads,
            "sliding_window": {str(i.layer): i.sliding_window for i in infos if i.sliding_window},
            "softcap": first.softcap, "sinks": any(i.sinks is not None for i in infos),
        }

    def attnprobe_uninstall(self) -> bool:
        """Remove all hooks (plain-prefill timing in benchmarks)."""
        st = self._attnprobe_state()
        for h in st.handles:
            h.remove()
        st.handles.clear()
        st.layers.clear()
        st.by_name.clear()
        st.skipped.clear()
        st.plans.clear()
        return True

    def attnprobe_begin(self, plans: list[dict], progress: bool = False) -> int:
        """Arm capture for the given plans (tag, input_ids, seg_ids, num_segments, query_positions, layers,
        qk_layers, share_group: the plans whose prompts carry one prefix-cache salt)."""
        st = self._attnprobe_state()
        if not st.handles:
            self.attnprobe_install()
        st.plans = {}
        for p in plans:
            plan = Plan.from_wire(p)
            st.plans[plan.tag] = plan
        arm_sharing(list(st.plans.values()))
        st.bound = {}
        st.step_inputs, st.step_map = None, None
        st.show_progress = bool(progress) and st.rank == 0
        if st.show_progress:
            from tqdm.auto import tqdm

            total = sum(pl.n for pl in st.plans.values())
            st.bar = tqdm(total=total, unit="tok", desc="vllm prefill", leave=False)
        return len(st.plans)

    def attnprobe_live_begin(self, plans: list[dict], retain_tokens: int) -> int:
        """Arm capture for the generation requests about to run (live plans: :mod:`attnprobe_hooks.vllm.live`).

        Each plan's peers, the plans that may serve its prefix-cache hits, are the other live plans of
        this call and the ones retained from earlier calls, with the same share group (layer selection).
        ``retain_tokens``: how many positions of finished live plans this rank keeps for later hits."""
        st = self._attnprobe_state()
        if not st.handles:
            self.attnprobe_install()
        st.retained.capacity = int(retain_tokens)
        st.plans = {}
        for p in plans:
            plan = Plan.from_wire(p)
            st.plans[plan.tag] = plan
        for plan in st.plans.values():
            mine = [x for x in st.plans.values() if x is not plan and x.share_group == plan.share_group]
            plan.peers = mine + st.retained.group(plan.share_group)[::-1]  # the most recent first
        st.bound = {}
        st.step_inputs, st.step_map = None, None
        st.show_progress = False
        return len(st.plans)

    def attnprobe_live_forget(self) -> int:
        """Drop every retained live plan (their keys); returns how many positions were held."""
        st = self._attnprobe_state()
        held = st.retained.tokens()
        st.retained.clear()
        return held

    def attnprobe_abort(self) -> bool:
        st = self._attnprobe_state()
        st.plans.clear()
        if st.bar is not None:
            st.bar.close()
            st.bar = None
        return True

    def attnprobe_collect(self) -> dict:
        """Return this rank's shard of every plan's scores and disarm.

        {"rank": r, "plans": {tag: {...json...}}, "tensors": safetensors bytes}; tensor names are
        ``{tag}|layer{L}`` ([nq, local_heads, S], placed at ``heads[L] = [offset, count]``),
        ``{tag}|token_sum`` ([nq, n], summed over this rank's heads and layers), and with
        ``qk_layers`` ``{tag}|q{L}`` / ``{tag}|k{L}`` (float32 [local heads, n, d]).
        """
        from safetensors.torch import save as st_save

        st = self._attnprobe_state()
        tensors: dict[str, torch.Tensor] = {}
        out: dict[str, Any] = {}
        for tag, plan in st.plans.items():
            plan.scorer.to_host()  # the step's scores stayed on the device until now: one copy per plan
            heads = {}
            for layer in plan.scorer.per_layer:
                info = st.info_for_layer(layer)
                tensors[f"{tag}|layer{layer}"] = plan.scorer.head_shard(layer, info.head_offset, info.num_heads)
                heads[str(layer)] = [info.head_offset, info.num_heads]
            tensors[f"{tag}|token_sum"] = plan.scorer.token_sum.contiguous()
            kv = {}
            for layer in sorted(plan.saved_q):
                info = st.info_for_layer(layer)
                tensors[f"{tag}|q{layer}"] = torch.cat(plan.saved_q[layer], dim=1).float().cpu().contiguous()
                if plan.saved_k.get(layer):
                    tensors[f"{tag}|k{layer}"] = torch.cat(plan.saved_k[layer], dim=1).float().cpu().contiguous()
                    kv[str(layer)] = [info.kv_head_offset, info.num_kv_heads]
            out[tag] = {"heads": heads, "kv_heads": kv, **plan.report()}
            if plan.live:
                out[tag]["failed"] = plan.failed
        for plan in st.plans.values():
            if plan.live:
                plan.scorer = plan.scorer.fresh()  # its scores left above; the keys stay for later hits
                st.retained.keep(plan)
        st.disarm()
        return {"rank": st.rank, "plans": out, "tensors": st_save(tensors) if tensors else b""}

    # ------------------------------------------------------------------ hooks
    def _attnprobe_model_hook(self, _module, args, kwargs):
        st = self._attnprobe_state()
        if not st.plans:
            return None
        input_ids = kwargs.get("input_ids", args[0] if args else None)
        positions = kwargs.get("positions", args[1] if len(args) > 1 else None)
        if positions is None:
            raise RuntimeError("attnprobe: the model forward received no positions")
        st.step_inputs = (input_ids, positions)
        st.step_map = None
        return None

    def _attnprobe_map_step(self, st: _State, layer_name: str) -> list[StepSlice]:
        """Slice the flat batch into requests and match each slice to a plan."""
        from vllm.forward_context import get_forward_context

        try:
            md = get_forward_context().attn_metadata
        except Exception:
            md = None
        if md is None or st.step_inputs is None:
            return []  # profiling / dummy run
        if isinstance(md, list):
            raise RuntimeError("attnprobe does not support micro-batching (ubatch); disable it during capture")
        layer_md = md.get(layer_name) if isinstance(md, dict) else md
        qsl = query_start_loc(layer_md, getattr(self, "model_runner", None))
        if qsl is None:
            raise RuntimeError(f"attnprobe: attention metadata {type(layer_md).__name__} has no query_start_loc")
        ids, pos = step_arrays(*st.step_inputs, qsl[-1])
        book = _request_bookkeeping(getattr(self, "model_runner", None))
        if book is not None:
            req_ids, requests = book

            def prompt_of(rid: str):
                state = requests.get(rid)
                return getattr(state, "prompt_token_ids", None)

            rids = list(req_ids[: len(qsl) - 1])
            rids += [None] * (len(qsl) - 1 - len(rids))  # padded rows (no tokens) have no request
            mapped = match_step(st.plans, qsl, pos, ids, req_ids=rids, prompt_of=prompt_of, bound=st.bound)
        else:  # an engine without request bookkeeping in the runner: match by tokens and position
            mapped = match_step(st.plans, qsl, pos, ids)
        st.retained.touch([sl.donor for sl in mapped if sl.donor is not None])
        if st.bar is not None:
            for sl in mapped:
                st.bar.update(sl.e - sl.s + (sl.start - sl.donor_from if sl.donor is not None else 0))
        return mapped

    def _attnprobe_layer_hook(self, module, args, kwargs):
        st = self._attnprobe_state()
        if not st.plans:
            return None
        info = st.layers.get(id(module))
        if info is None:
            return None
        if st.step_map is None:
            st.step_map = self._attnprobe_map_step(st, info.name)
        if not st.step_map:
            return None
        t0 = time.perf_counter()
        query = args[0] if args else kwargs["query"]
        key = args[1] if len(args) > 1 else kwargs.get("key")
        shared = None
        if key is None:  # KV shared with an earlier layer
            target = st.by_name.get(info.kv_share_target or "")
            shared = target.layer if target is not None else None
        with torch.inference_mode():
            for sl in donor_order(st.step_map, info.layer):
                sl.plan.observe_layer(info, query[sl.s:sl.e], None if key is None else key[sl.s:sl.e], sl.start,
                                      shared_keys_layer=shared, donor=sl.donor, donor_from=sl.donor_from)
        dt = (time.perf_counter() - t0) / len(st.step_map)
        for sl in st.step_map:
            sl.plan.hook_seconds += dt
        return None
