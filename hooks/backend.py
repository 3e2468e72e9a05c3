"""The capture-backend protocol and its registry.

A backend turns :class:`CapturePlan` objects (a tokenized trajectory, its segment ids and the
query positions to score) into :class:`BackendOutput` objects (a filled
:class:`attnprobe_hooks.scoring.QueryScorer`, optional q/k tensors and backend metadata).
Everything else -- rendering, query selection, result assembly -- is backend-neutral and lives in
:mod:`attnprobe.capture.api`.

Adding a backend is one module with a class that satisfies :class:`CaptureBackend` and one
:func:`register` call below. Backends are imported lazily by module path, so an optional
dependency (vLLM) is imported only when its backend is asked for.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, runtime_checkable

import numpy as np

if TYPE_CHECKING:  # torch is imported only when a capture runs, so `import attnprobe` stays light
    import torch

    from attnprobe_hooks.scoring import QueryScorer

DEFAULT_CHUNK_SIZE = 512  # the CPU chunk, and a vLLM engine's when none is given (attnprobe_hooks.chunking)


@dataclass
class LoadedModel:
    """A model plus everything capture needs to describe its outputs.

    ``backend`` names the registry entry that loaded it (and that runs its captures).
    """

    model: Any
    tokenizer: Any
    spec: str
    name: str
    backend: str
    dtype: str
    source: str  # "gguf" | "hf-folder" | "hf-cache"
    attn_implementation: str = "sdpa"
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def chat_template(self) -> str | None:
        return getattr(self.tokenizer, "chat_template", None)

    @property
    def template_hash(self) -> str:
        from attnprobe.render.rendering import template_hash

        return template_hash(self.tokenizer)

    @property
    def num_layers(self) -> int:
        cfg = self.model.config
        cfg = getattr(cfg, "text_config", None) or cfg
        return int(cfg.num_hidden_layers)

    @property
    def max_positions(self) -> int | None:
        cfg = self.model.config
        cfg = getattr(cfg, "text_config", None) or cfg
        return getattr(cfg, "max_position_embeddings", None)


@dataclass(frozen=True, eq=False)
class CapturePlan:
    """One trajectory to capture, in backend-neutral terms.

    input_ids: [n] token ids. token_segment: [n] segment index of every token. query_positions:
    strictly increasing absolute positions to score. layers: model layers to score (None = every
    attention layer). save_qk_layers: layers whose post-RoPE q/k are returned too. desc: a label
    for progress bars.
    """

    input_ids: np.ndarray
    token_segment: np.ndarray
    num_segments: int
    query_positions: tuple[int, ...]
    layers: tuple[int, ...] | None = None
    save_qk_layers: tuple[int, ...] = ()
    desc: str | None = None

    @property
    def n(self) -> int:
        return len(self.input_ids)

    def new_scorer(self, layers: Sequence[int] | None = None) -> QueryScorer:
        """An empty scorer for this plan (``layers`` overrides the plan's layer selection)."""
        import torch

        from attnprobe_hooks.scoring import QueryScorer

        chosen = self.layers if layers is None else layers
        return QueryScorer(seg_ids=torch.as_tensor(self.token_segment), num_segments=self.num_segments,
                           query_positions=torch.as_tensor(self.query_positions),
                           layers=None if chosen is None else list(chosen))


class BackendOutput(NamedTuple):
    """What a backend returns per plan: the filled scorer, q/k tensors by name, metadata to record."""

    scorer: QueryScorer
    qk: dict[str, torch.Tensor]
    info: dict[str, Any]


class BackendOutputs(list):
    """A run's outputs (one :class:`BackendOutput` per plan, in plan order) and its prefill counts.

    ``sharing``: a :class:`attnprobe_hooks.sharing.SharingStats` (tokens in the plans, tokens
    prefilled, prefix-trie size), or None for a backend that does not count.
    """

    sharing: Any = None


@dataclass(frozen=True)
class GenerationCounts:
    """Tokens of one generation: the prompt, what was prefilled before the first new token (1 when the
    capture's cache is reused; the whole prompt for a plain ``generate``), and the new tokens."""

    prompt_tokens: int
    prefilled_tokens: int
    new_tokens: int
    seconds: float = field(default=0.0, compare=False)  # wall time of the generation (not of the capture)

    @property
    def saved_tokens(self) -> int:
        return self.prompt_tokens - self.prefilled_tokens


@dataclass(frozen=True)
class GenerationRequest:
    """Continue ``plans[plan].input_ids[:prompt_length]`` greedily for up to ``max_new_tokens``;
    ``kwargs`` go to ``model.generate`` (``pad_token_id``, ``eos_token_id``, a fresh
    ``stopping_criteria`` per request, ...)."""

    plan: int
    prompt_length: int
    max_new_tokens: int
    kwargs: Mapping[str, Any] = field(default_factory=dict)


@runtime_checkable
class CaptureBackend(Protocol):
    """A capture backend: loads models and runs chunked prefills with the scoring hooks active."""

    name: str
    # keyword options ``load`` accepts besides ``dtype`` (lets a CLI pass only what applies)
    load_options: tuple[str, ...]

    def load(self, spec: str, *, dtype: str, **options: Any) -> LoadedModel:
        """Load ``spec`` ("default", an HF folder, a .gguf file, a cached hub id) for capture."""
        ...

    def run(self, model: LoadedModel, plans: Sequence[CapturePlan], *, chunk_size: int,
            progress: bool = False, share_prefixes: bool = True) -> list[BackendOutput]:
        """Capture every plan; one output per plan, in order.

        ``share_prefixes``: the backend may prefill a prefix common to several plans once (the
        results equal independent captures within float rounding, 1e-5); False asks for one
        independent prefill per plan. A backend returns a :class:`BackendOutputs` to report its
        prefill counts.
        """
        ...

    # Optional: ``capture_and_generate(model, plans, requests, *, chunk_size, progress=False)`` ->
    # (outputs, new token ids per request, GenerationCounts per request): capture with prefix sharing
    # and answer each GenerationRequest greedily from the cache the capture built (the transformers
    # backend has it; callers check with ``hasattr`` and otherwise generate in full).


# ---------------------------------------------------------------------------------------- registry
_REGISTRY: dict[str, str] = {}
_INSTANCES: dict[str, CaptureBackend] = {}
_LOCK = threading.RLock()


def register(name: str, target: str) -> None:
    """Register a backend class by import path, ``"package.module:ClassName"`` (imported on first use).
    Registering a name again with the same target does nothing; with another target it is refused, so that
    one plugin cannot silently replace a backend another part of the program already relies on."""
    if ":" not in target:
        raise ValueError(f"backend target must look like 'package.module:ClassName', got {target!r}")
    with _LOCK:
        if name in _REGISTRY:
            if _REGISTRY[name] == target:
                return
            raise ValueError(f"backend {name!r} is already registered as {_REGISTRY[name]!r}; "
                             f"refusing to replace it with {target!r}")
        _REGISTRY[name] = target


def backend_names() -> list[str]:
    """Registered backend names (e.g. for a ``--backend`` option's choices)."""
    return sorted(_REGISTRY)


def applicable_options(name: str, candidates: dict[str, Any]) -> dict[str, Any]:
    """The subset of ``candidates`` that backend ``name``'s ``load`` accepts (``load_options``)."""
    accepted = set(get_backend(name).load_options)
    return {k: v for k, v in candidates.items() if k in accepted}


def get_backend(name: str) -> CaptureBackend:
    """The backend registered as ``name`` (one instance per process)."""
    with _LOCK:
        if name in _INSTANCES:
            return _INSTANCES[name]
        target = _REGISTRY.get(name)
        if target is None:
            raise ValueError(f"unknown backend {name!r}; use one of {', '.join(repr(n) for n in sorted(_REGISTRY))}")
        module_name, _, cls_name = target.partition(":")
        cls = getattr(importlib.import_module(module_name), cls_name)
        backend = cls()
        if getattr(backend, "name", None) != name:
            raise RuntimeError(f"backend {target} calls itself {getattr(backend, 'name', None)!r}, "
                               f"registered as {name!r}")
        _INSTANCES[name] = backend
        return backend


register("transformers", "attnprobe_hooks.transformers.backend:TransformersBackend")
register("vllm", "attnprobe_hooks.vllm.backend:VllmBackend")
