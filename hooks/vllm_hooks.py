"""vLLM backend: forward pre-hooks on the attention layers inside vLLM's worker processes.

vLLM runs the model in worker processes (one per tensor-parallel rank, or in-process). We reach
them through vLLM's worker-extension mechanism: ``LLM(..., worker_extension_cls=EXTENSION)`` makes
every worker inherit :class:`AttnprobeWorkerExtension`, and ``llm.collective_rpc("attnprobe_...")``
calls its methods on every rank. Nothing is pickled: the class is imported by name in each worker,
plans go in as plain lists and dicts, results come back as safetensors bytes plus a JSON-able dict.

Inside a worker:

- a forward pre-hook on the model (``runner.get_model()``) records the flat ``input_ids`` and
  ``positions`` of the step;
- a forward pre-hook on every softmax-attention layer (vLLM's ``Attention`` module) reads the
  flat post-RoPE ``query [tokens, local_heads*head_dim]`` and ``key [tokens, local_kv_heads*head_dim]``
  before the kernel runs. The step's requests are sliced with the layer's attention metadata
  (``query_start_loc``); each slice is matched to a capture plan by its token ids and its first
  position, so several trajectories in one ``generate`` call, split into prefill chunks by the
  scheduler in any way, land in the right plan. Keys are appended to a per-(plan, layer) buffer
  (preallocated, only up to the last query position) and the query rows that fall in the chunk
  are scored at once with :meth:`attnprobe_hooks.scoring.QueryScorer.score_layer`.

Tensor parallelism: each rank holds ``H/tp`` query heads and ``max(1, KVH/tp)`` KV heads. A rank
scores its own query heads against its own KV heads and reports them at their global head index
(``rank * local_heads``); the driver places the shards. Each query head is scored on exactly one
rank, so KV heads replicated over ranks (tp > KVH) are never counted twice; for saved keys only
the first replica of a KV head is kept. ``head_dim`` is the module's ``head_size``, which vLLM
takes from the config's ``head_dim`` (not ``hidden_size // heads``).
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from attnprobe_hooks.scoring import QueryScorer

EXTENSION = "attnprobe_hooks.vllm_hooks.AttnprobeWorkerExtension"


@dataclass
class LayerInfo:
    """What scoring needs to know about one hooked attention layer on this rank."""

    name: str
    layer: int
    num_heads: int  # local (this rank)
    num_kv_heads: int  # local
    head_dim: int
    scale: float
    head_offset: int  # global index of this rank's first query head
    kv_head_offset: int  # global index of this rank's first KV head
    total_heads: int
    total_kv_heads: int
    kv_replica_first: bool  # this rank holds the first copy of its KV heads
    sliding_window: int | None = None
    softcap: float | None = None
    sinks: torch.Tensor | None = None
    kv_share_target: str | None = None


@dataclass
class Plan:
    """One trajectory being captured: its tokens, its scorer and its per-layer key buffers."""

    tag: str
    input_ids: np.ndarray
    scorer: QueryScorer
    n_keys: int  # keys needed: up to the last query position
    qk_layers: set[int]
    next_start: int = 0
    steps: int = 0
    shared_steps: int = 0  # steps whose batch also held other requests
    restarts: int = 0
    keys: dict[int, torch.Tensor] = field(default_factory=dict)
    saved_q: dict[int, list[torch.Tensor]] = field(default_factory=dict)
    saved_k: dict[int, list[torch.Tensor]] = field(default_factory=dict)
    calls: int = 0
    qpos: np.ndarray | None = None  # query positions as numpy (cheap per-chunk test, no torch op)
    hook_seconds: float = 0.0  # time spent inside the hooks for this plan (overhead measure)

    @property
    def n(self) -> int:
        return len(self.input_ids)

    def reset(self) -> None:
        """Start over (the engine recomputes a preempted request from position 0)."""
        s = self.scorer
        self.scorer = QueryScorer(seg_ids=s.seg_ids, num_segments=s.num_segments,
                                  query_positions=s.query_positions, layers=s.layers)
        self.keys.clear()
        self.saved_q.clear()
        self.saved_k.clear()
        self.next_start = 0
        self.restarts += 1


class _State:
    """Per-worker capture state (lives in the worker process, never leaves it)."""

    def __init__(self):
        self.handles: list[Any] = []
        self.layers: dict[int, LayerInfo] = {}  # id(module) -> info
        self.by_name: dict[str, LayerInfo] = {}
        self.skipped: list[dict] = []
        self.plans: dict[str, Plan] = {}
        self.step_inputs: tuple[torch.Tensor | None, torch.Tensor] | None = None
        self.step_map: list[tuple[Plan, int, int, int]] | None = None
        self.rank = 0
        self.tp_size = 1
        self.show_progress = False
        self.bar = None
        self.aranges: torch.Tensor = torch.arange(0)

    @property
    def active(self) -> bool:
        return bool(self.plans)

    def arange(self, n: int) -> torch.Tensor:
        if len(self.aranges) < n:
            self.aranges = torch.arange(max(n, 2 * len(self.aranges)))
        return self.aranges[:n]


def _layer_index(name: str) -> int:
    m = re.search(r"layers\.(\d+)\.", name + ".")
    if m:
        return int(m.group(1))
    nums = [int(x) for x in name.split(".") if x.isdigit()]
    if len(nums) != 1:
        raise RuntimeError(f"cannot tell the layer index of attention module {name!r}")
    return nums[0]


def _tp_info() -> tuple[int, int]:
    try:
        from vllm.distributed import get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size

        return get_tensor_model_parallel_rank(), get_tensor_model_parallel_world_size()
    except Exception:  # not initialised (tests of the hook logic outside an engine)
        return 0, 1


def _describe_attention(name: str, module, rank: int, tp: int, total_kv_heads: int | None) -> LayerInfo:
    impl = getattr(module, "impl", None)
    h, kvh, d = int(module.num_heads), int(module.num_kv_heads), int(module.head_size)
    if h % kvh:
        raise RuntimeError(f"{name}: {h} local query heads are not a multiple of {kvh} local KV heads")
    total_heads = h * tp
    total_kv = int(total_kv_heads) if total_kv_heads else kvh * tp
    if total_heads % total_kv:
        raise RuntimeError(f"{name}: {total_heads} query heads are not a multiple of {total_kv} KV heads")
    group = total_heads // total_kv  # query heads per KV head, globally
    head_offset = rank * h
    # Global KV head of this rank's first query head. With tp > KVH vLLM replicates each KV head on
    # tp/KVH ranks (rank r holds KV head r // replicas), which is the same number.
    kv_head_offset = head_offset // group
    replicas = max(1, tp // total_kv)
    if kvh * tp != total_kv * replicas:
        raise RuntimeError(f"{name}: {kvh} local KV heads on {tp} ranks do not match {total_kv} KV heads")
    sw = getattr(module, "sliding_window", None)
    softcap = getattr(impl, "logits_soft_cap", None)
    sinks = getattr(impl, "sinks", None)
    scale = getattr(impl, "scale", None)
    if scale is None:
        scale = 1.0 / math.sqrt(d)
    return LayerInfo(
        name=name, layer=_layer_index(name), num_heads=h, num_kv_heads=kvh, head_dim=d, scale=float(scale),
        head_offset=head_offset, kv_head_offset=kv_head_offset, total_heads=total_heads,
        total_kv_heads=total_kv, kv_replica_first=(rank % replicas) == 0,
        sliding_window=int(sw) if isinstance(sw, int) and sw > 0 else None,
        softcap=float(softcap) if softcap else None, sinks=sinks if isinstance(sinks, torch.Tensor) else None,
        kv_share_target=getattr(module, "kv_sharing_target_layer_name", None),
    )


def _query_start_loc(md, runner) -> list[int] | None:
    qsl = getattr(md, "query_start_loc", None)
    if qsl is None and runner is not None:
        buf = getattr(runner, "query_start_loc", None)
        qsl = getattr(buf, "cpu", None) if buf is not None else None
        if qsl is not None:
            num_reqs = getattr(getattr(runner, "input_batch", None), "num_reqs", None)
            qsl = qsl[: num_reqs + 1] if num_reqs is not None else None
    if qsl is None:
        return None
    return [int(x) for x in qsl.tolist()]


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

    def _attnprobe_model(self):
        runner = self.model_runner
        return runner.get_model() if hasattr(runner, "get_model") else runner.model

    # ------------------------------------------------------------------ RPC methods
    def attnprobe_install(self) -> dict:
        """Hook every softmax-attention layer (idempotent). Returns what was hooked and skipped."""
        st = self._attnprobe_state()
        if not st.handles:
            from vllm.model_executor.layers.attention import Attention

            try:
                from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase
            except ImportError:  # pragma: no cover - older vLLM
                AttentionLayerBase = ()  # type: ignore[assignment]
            try:
                from vllm.v1.attention.backend import AttentionType

                decoder = AttentionType.DECODER
            except ImportError:  # pragma: no cover
                decoder = "decoder"
            st.rank, st.tp_size = _tp_info()
            model = self._attnprobe_model()
            total_kv = None
            try:
                total_kv = self.model_config.get_total_num_kv_heads()
            except Exception:  # the layer's own numbers are used instead
                pass
            for name, module in model.named_modules():
                if type(module) is Attention and getattr(module, "attn_type", decoder) == decoder:
                    info = _describe_attention(getattr(module, "layer_name", name) or name, module,
                                               st.rank, st.tp_size, total_kv)
                    st.layers[id(module)] = info
                    st.by_name[info.name] = info
                    st.handles.append(module.register_forward_pre_hook(self._attnprobe_layer_hook,
                                                                       with_kwargs=True))
                elif AttentionLayerBase and isinstance(module, AttentionLayerBase):
                    try:
                        idx = _layer_index(name)
                    except RuntimeError:
                        idx = None
                    st.skipped.append({"module": name, "layer": idx, "kind": type(module).__name__})
            if not st.layers:
                raise RuntimeError("attnprobe found no softmax-attention layer (vLLM Attention) in the model")
            st.handles.append(model.register_forward_pre_hook(self._attnprobe_model_hook, with_kwargs=True))
        infos = sorted(st.layers.values(), key=lambda i: i.layer)
        first = infos[0]
        return {
            "rank": st.rank, "tp_size": st.tp_size,
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
        """Arm capture for the given plans (tag, input_ids, seg_ids, num_segments, query_positions, layers, qk_layers)."""
        st = self._attnprobe_state()
        if not st.handles:
            self.attnprobe_install()
        st.plans = {}
        for p in plans:
            ids = np.asarray(p["input_ids"], dtype=np.int64)
            qpos = torch.as_tensor(p["query_positions"], dtype=torch.long)
            scorer = QueryScorer(seg_ids=torch.as_tensor(p["seg_ids"], dtype=torch.long),
                                 num_segments=int(p["num_segments"]), query_positions=qpos,
                                 layers=None if p.get("layers") is None else [int(x) for x in p["layers"]])
            st.plans[p["tag"]] = Plan(tag=p["tag"], input_ids=ids, scorer=scorer,
                                      n_keys=int(qpos.max()) + 1 if len(qpos) else 0,
                                      qk_layers={int(x) for x in p.get("qk_layers", [])},
                                      qpos=qpos.numpy().copy())
        st.step_inputs, st.step_map = None, None
        st.show_progress = bool(progress) and st.rank == 0
        if st.show_progress:
            from tqdm.auto import tqdm

            total = sum(pl.n for pl in st.plans.values())
            st.bar = tqdm(total=total, unit="tok", desc="vllm prefill", leave=False)
        return len(st.plans)

    def attnprobe_abort(self) -> bool:
        st = self._attnprobe_state()
        st.plans.clear()
        if st.bar is not None:
            st.bar.close()
            st.bar = None
        return True

    def attnprobe_collect(self) -> dict:
        """Return this rank's shard of every plan's scores and disarm.

        {"plans": {tag: {...json...}}, "tensors": safetensors bytes}; tensor names are
        ``{tag}|layer{L}`` ([nq, local_heads, S], placed at ``heads[L] = [offset, count]``),
        ``{tag}|token_sum`` ([nq, n], summed over this rank's heads and layers), and with
        ``qk_layers`` ``{tag}|q{L}`` / ``{tag}|k{L}`` (float32 [local heads, n, d]).
        """
        from safetensors.torch import save as st_save

        st = self._attnprobe_state()
        tensors: dict[str, torch.Tensor] = {}
        out: dict[str, Any] = {}
        for tag, plan in st.plans.items():
            heads = {}
            for layer, arr in plan.scorer.per_layer.items():
                info = self._attnprobe_info_for_layer(layer)
                tensors[f"{tag}|layer{layer}"] = arr[:, info.head_offset:info.head_offset + info.num_heads].contiguous()
                heads[str(layer)] = [info.head_offset, info.num_heads]
            tensors[f"{tag}|token_sum"] = plan.scorer.token_sum.contiguous()
            kv = {}
            for layer in sorted(plan.saved_q):
                info = self._attnprobe_info_for_layer(layer)
                tensors[f"{tag}|q{layer}"] = torch.cat(plan.saved_q[layer], dim=1).contiguous()
                if plan.saved_k.get(layer):
                    tensors[f"{tag}|k{layer}"] = torch.cat(plan.saved_k[layer], dim=1).contiguous()
                    kv[str(layer)] = [info.kv_head_offset, info.num_kv_heads]
            out[tag] = {"heads": heads, "kv_heads": kv, "tokens_seen": plan.next_start, "n": plan.n,
                        "steps": plan.steps, "shared_steps": plan.shared_steps, "calls": plan.calls, "restarts": plan.restarts,
                        "hook_seconds": round(plan.hook_seconds, 4)}
        st.plans = {}
        st.step_inputs, st.step_map = None, None
        if st.bar is not None:
            st.bar.close()
            st.bar = None
        return {"rank": st.rank, "plans": out, "tensors": st_save(tensors) if tensors else b""}

    # ------------------------------------------------------------------ hooks
    def _attnprobe_info_for_layer(self, layer: int) -> LayerInfo:
        for info in self._attnprobe_state().layers.values():
            if info.layer == layer:
                return info
        raise KeyError(layer)

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

    def _attnprobe_map_step(self, st: _State, layer_name: str) -> list[tuple[Plan, int, int, int]]:
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
        qsl = _query_start_loc(layer_md, getattr(self, "model_runner", None))
        if qsl is None:
            raise RuntimeError(f"attnprobe: attention metadata {type(layer_md).__name__} has no query_start_loc")
        input_ids, positions = st.step_inputs
        pos = positions.reshape(-1)[: qsl[-1]].cpu().numpy() if positions.dim() == 1 else \
            positions[0, : qsl[-1]].cpu().numpy()  # M-RoPE: [3, tokens]; row 0 is the text position
        ids = input_ids[: qsl[-1]].cpu().numpy() if input_ids is not None else None
        mapped = []
        used: set[str] = set()
        for i in range(len(qsl) - 1):
            s, e = qsl[i], qsl[i + 1]
            if e <= s:
                continue
            start = int(pos[s])
            length = e - s
            plan = None
            for cand in st.plans.values():
                if cand.tag in used or start + length > cand.n:
                    continue
                if ids is not None and not np.array_equal(cand.input_ids[start:start + length], ids[s:e]):
                    continue
                if ids is None and len(st.plans) > 1:
                    raise RuntimeError("attnprobe: the model got no input_ids (embeddings input); "
                                       "capture one trajectory per generate call")
                if cand.next_start == start:
                    plan = cand
                    break
                if start == 0 and plan is None:
                    plan = cand  # recompute after preemption (only if no fresh plan matches)
            if plan is None:
                continue
            if start == 0 and plan.next_start > 0:
                plan.reset()
            used.add(plan.tag)
            plan.next_start = start + length
            plan.steps += 1
            mapped.append((plan, s, e, start))
            if st.bar is not None:
                st.bar.update(length)
        if sum(1 for i in range(len(qsl) - 1) if qsl[i + 1] > qsl[i]) > 1:
            for plan, *_ in mapped:
                plan.shared_steps += 1
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
        h, kvh, d = info.num_heads, info.num_kv_heads, info.head_dim
        layer = info.layer
        with torch.inference_mode():
            for plan, s, e, start in st.step_map:
                if not plan.scorer.wants(layer):
                    continue
                plan.calls += 1
                length = e - s
                end = start + length
                q = query[s:e].reshape(length, h, d)
                if key is not None:
                    k = key[s:e].reshape(length, kvh, d)
                    if start < plan.n_keys:
                        buf = plan.keys.get(layer)
                        if buf is None:
                            buf = torch.empty(kvh, plan.n_keys, d, dtype=k.dtype, device=k.device)
                            plan.keys[layer] = buf
                        stop = min(end, plan.n_keys)
                        buf[:, start:stop] = k[: stop - start].transpose(0, 1)
                    k_buf = plan.keys.get(layer)
                else:  # KV shared with an earlier layer: read that layer's keys
                    target = st.by_name.get(info.kv_share_target or "")
                    k_buf = plan.keys.get(target.layer) if target is not None else None
                    k = None
                qp = plan.scorer.query_positions
                if k_buf is not None and bool(np.any((plan.qpos >= start) & (plan.qpos < end))):
                    stop = min(end, plan.n_keys)
                    plan.scorer.score_layer(
                        layer, q.transpose(0, 1), k_buf[:, :stop], start, st.arange(stop), info.scale,
                        head_offset=info.head_offset, total_heads=info.total_heads,
                        sliding_window=info.sliding_window, softcap=info.softcap, sinks=info.sinks)
                elif layer not in plan.scorer.per_layer:
                    plan.scorer.per_layer[layer] = torch.zeros(
                        len(qp), info.total_heads, plan.scorer.num_segments, dtype=torch.float32)
                if layer in plan.qk_layers:
                    plan.saved_q.setdefault(layer, []).append(q.transpose(0, 1).float().cpu().clone())
                    if k is not None and info.kv_replica_first:
                        plan.saved_k.setdefault(layer, []).append(k.transpose(0, 1).float().cpu().clone())
        dt = (time.perf_counter() - t0) / len(st.step_map)
        for plan, *_ in st.step_map:
            plan.hook_seconds += dt
        return None
