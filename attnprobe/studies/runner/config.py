"""Settings of one runner configuration (the paper's ablation switches plus budgets)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

FILTER_MODES = ("none", "in-context", "isolated")
VALIDATION_MODES = ("off", "stage1", "full")  # full = stage 1 + stage 2

PRESETS = {
    # smolagents-DR-like baseline: no filter, the manager answers directly.
    "baseline": {"filter": "none", "validation": "off"},
    # NIS-Agent: context-isolated filter + isolation-based stepwise validation (both stages).
    "nis-agent": {"filter": "isolated", "validation": "full"},
}


@dataclass
class RunSettings:
    filter: str = "isolated"
    validation: str = "full"
    manager_steps: int = 3        # manager tool calls before it must answer
    worker_steps: int = 3         # worker tool calls per delegated sub-task
    max_rewrites: int = 1         # query rewrites the filter may trigger per web_search
    # Stage-2 checks per validation (cost cap): the first N-1 steps and the answer step, which is
    # always checked; the unchecked labels are logged and recorded in the results.
    max_validation_steps: int = 8
    validation_extra_steps: int = 3  # manager steps added when a validation does not accept the answer
    top_k: int = 4                # search results per query
    page_chars: int = 1200        # visit_page output is cut to this many characters
    max_tokens: int = 128         # per model call
    temperature: float = 0.0      # greedy by default
    name: str = "custom"
    extra: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.filter not in FILTER_MODES:
            raise ValueError(f"filter must be one of {', '.join(FILTER_MODES)}; got {self.filter!r}")
        if self.validation not in VALIDATION_MODES:
            raise ValueError(f"validation must be one of {', '.join(VALIDATION_MODES)}; got {self.validation!r}")
        for key in ("manager_steps", "worker_steps", "max_tokens", "top_k", "page_chars"):
            if getattr(self, key) < 1:
                raise ValueError(f"{key} must be at least 1")
        if self.max_rewrites < 0 or self.max_validation_steps < 1 or self.validation_extra_steps < 0:
            raise ValueError("max_rewrites and validation_extra_steps must be >= 0 and max_validation_steps >= 1")
        if self.temperature < 0:
            raise ValueError("temperature must be >= 0")

    @classmethod
    def preset(cls, preset: str, **overrides) -> RunSettings:
        if preset not in PRESETS:
            raise ValueError(f"unknown preset {preset!r}; use one of {', '.join(PRESETS)}")
        return cls(**{**PRESETS[preset], "name": preset, **overrides})

    def with_(self, **changes) -> RunSettings:
        return replace(self, **changes)

    def to_dict(self) -> dict:
        d = asdict(self)
        if not d["extra"]:
            d.pop("extra")
        return d
