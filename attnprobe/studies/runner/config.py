"""Settings of one runner configuration (the paper's ablation switches plus budgets).

Where a default comes from: seed 000 states the temperature (0.0) and the output limit (4096 tokens
for non-reasoning models, C.3) and the two validation stages (4.2). Every other number here is ours,
not the seeds' (marked "ours" below and in docs/runner.md): the seed does not give step budgets, the
number of results, a page length, a rewrite count or a stage-2 cap.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

from attnprobe.agents.context import NO_SETTING, Setting, as_setting
from attnprobe.agents.policies import setting_rules
from attnprobe.agents.recorder import RUNNER_MAX_NEW_TOKENS  # seed 000, C.3
from attnprobe.agents.search import CORPUS_HELP, SEARCH_HELP, SEARCH_KINDS
from attnprobe.io.options import OnceAction, non_negative_int, option, positive_int
from attnprobe.io.settings import as_recorded

FILTER_MODES = ("none", "in-context", "isolated")
VALIDATION_MODES = ("off", "stage1", "full")  # full = stage 1 + stage 2 (seed 000, 4.2)
# Seed 000, C.3: "For non-reasoning models, we limit the output token size to 4096."

PRESETS = {
    # smolagents-DR-like baseline: no filter, the manager answers directly.
    "baseline": {"filter": "none", "validation": "off"},
    # NIS-Agent: context-isolated filter + isolation-based stepwise validation, the seed's two stages
    # (4.2: "If all steps are valid, it confirms the final answer as correct"); no third gate.
    "nis-agent": {"filter": "isolated", "validation": "full", "final_check": False},
}


@dataclass
class RunSettings:
    """One runner configuration; the fields declared with :func:`~attnprobe.io.options.option` are also
    ``attnprobe run``'s options (one declaration, one default). ``max_new_tokens`` and ``temperature`` are the
    generation group's --max-new-tokens and --temperature (same defaults; tests/unit/test_option_defaults.py)."""

    filter: str = "isolated"
    validation: str = "full"
    manager_steps: int = option(3, flag="--manager-steps", type=non_negative_int,  # ours
                                help="manager tool calls before it must answer (default {default})")
    worker_steps: int = option(3, flag="--worker-steps", type=non_negative_int,  # ours
                               help="worker tool calls per delegated sub-task (default {default})")
    max_rewrites: int = option(1, flag="--max-rewrites", type=non_negative_int,  # ours
                               help="query rewrites the filter may trigger per web_search (default {default})")
    # Ours (a cost cap, not in the seeds): stage-2 checks per validation, the first N-1 steps and the
    # answer step, which is always checked; the unchecked labels are logged and recorded in the results.
    max_validation_steps: int = option(
        8, flag="--max-validation-steps", type=positive_int,
        help="stage-2 checks per validation; the answer step is always checked (default {default})")
    # Ours: manager steps added when a validation does not accept the answer (seed 000, 4.2, only says
    # the manager "re-evaluates the provided suggestions with full context").
    validation_extra_steps: int = option(
        3, flag="--validation-extra-steps", type=non_negative_int,
        help="manager steps added after a validation that does not accept the answer (default {default})")
    top_k: int = 4                # ours: search results per query
    page_chars: int = 1200        # ours: visit_page output is cut to this many characters
    max_new_tokens: int = RUNNER_MAX_NEW_TOKENS  # per model call (seed 000, C.3)
    temperature: float = 0.0      # greedy (seed 000, C.3: "we set the temperature of all models to 0.0")
    # Ours, off by default: a third, task-aware check after stage 2 (agent ``validator_final``) that sees
    # only the task, the steps' claims and the answer. Seed 000 has two stages.
    final_check: bool = option(False, flag="--final-check", action="store_true",
                               help="ours, not in the seeds: a third, task-aware validation gate after stage 2 "
                                    "(default off)")
    # The context policy applied to what the search worker sees at each of its steps (``none``, or policies
    # joined by ``+``: mask:K, mask-obs:K, ircot:o|oq|oqp, refine:...; attnprobe.agents.context): a parsed
    # Setting (the CLI parses it at its edge; a spec from a Python caller is parsed once, here); records its spec.
    context_policy: Setting = NO_SETTING
    # Issue 30, off by default (the seeds decode freely): decoding constrained to the runner's call format.
    # It changes the agent's behaviour, so it is part of every stamp, but only when on: runs without it
    # record exactly what they recorded before.
    structured_actions: bool = option(
        False, flag="--structured-actions", action="store_true",
        help="constrain decoding to the runner's call format (default off: seed 000's agent decodes "
             "freely). Changes the agent's behaviour; recorded in every call's settings and the summary")
    name: str = "custom"
    extra: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.filter not in FILTER_MODES:
            raise ValueError(f"filter must be one of {', '.join(FILTER_MODES)}; got {self.filter!r}")
        if self.validation not in VALIDATION_MODES:
            raise ValueError(f"validation must be one of {', '.join(VALIDATION_MODES)}; got {self.validation!r}")
        for key in ("manager_steps", "worker_steps", "max_new_tokens", "top_k", "page_chars"):
            if getattr(self, key) < 1:
                raise ValueError(f"{key} must be at least 1")
        if self.max_rewrites < 0 or self.max_validation_steps < 1 or self.validation_extra_steps < 0:
            raise ValueError("max_rewrites and validation_extra_steps must be >= 0 and max_validation_steps >= 1")
        if self.temperature < 0:
            raise ValueError("temperature must be >= 0")
        self.context_policy = as_setting(self.context_policy)  # PolicySpecError: the CLI names its option

    @classmethod
    def preset(cls, preset: str, **overrides) -> RunSettings:
        if preset not in PRESETS:
            raise ValueError(f"unknown preset {preset!r}; use one of {', '.join(PRESETS)}")
        return cls(**{**PRESETS[preset], "name": preset, **overrides})

    def with_(self, **changes) -> RunSettings:
        return replace(self, **changes)

    def to_dict(self) -> dict:
        d = as_recorded(asdict(self))
        d["context_policy"] = self.context_policy.spec  # a record holds the setting's spec
        if not d["extra"]:
            d.pop("extra")
        if not d["structured_actions"]:  # recorded only when on: earlier runs' stamps stay valid
            d.pop("structured_actions")
        if d["context_policy"] == "none":  # runs without a policy record exactly what they recorded before
            d.pop("context_policy")
        elif setting_rules(d["context_policy"]):
            # which masking rule and placeholder (issue 26: mask:K changed from counting observations to the
            # released scaffold's turns): recorded with every call and in the summary, and a run made under
            # the old rule is not resumed under the new one
            d["context_rules"] = setting_rules(d["context_policy"])
        return d


@dataclass(frozen=True)
class RunCommandOptions:
    """The options of ``attnprobe run`` besides :class:`RunSettings`' own: the questions file, the preset and
    what overrides it (``filter``, ``validation``, ``name``, ``context_policy``: None keeps the preset's),
    the search backend, how many questions, the batch and the deprecated ``--resume``; declared once here."""

    questions: str | None = option(
        None, flag="questions", nargs="?",
        help="JSONL of questions ({{id, question, answer, aliases}}); default: the 12 shipped questions")
    preset: str = option("nis-agent", flag="--preset", choices=sorted(PRESETS),
                         help="baseline = no filter, no validation; nis-agent = isolated filter + stages 1+2 (default)")
    filter: str | None = option(None, flag="--filter", choices=FILTER_MODES, help="override the preset's filter")
    validation: str | None = option(None, flag="--validation", choices=VALIDATION_MODES,
                                    help="override the preset's validation (full = 1+2)")
    name: str | None = option(None, flag="--name",
                              help="setting name used in run ids and the table (default: the preset, or 'custom' "
                                   "with overrides, joined with the context policy: baseline_mask-1)")
    search: str = option("bm25", flag="--search", choices=SEARCH_KINDS, help=SEARCH_HELP)
    corpus: str | None = option(None, flag="--corpus", help=CORPUS_HELP)
    limit: int | None = option(None, flag="--limit", type=positive_int, help="only the first N questions (N >= 1)")
    context_policy: str | None = option(
        None, flag="--context-policy", action=OnceAction, metavar="SETTING",
        help="the context policy applied to what the search worker sees at each step: mask:K (seed 002's released "
             "rule, K turns), mask-obs:K (K observations), ircot:o|oq|oqp, refine:bm25[:N], "
             "refine:openai:URL:MODEL; compose with + (e.g. ircot:oq+refine:bm25:3). Given once: a run is one "
             "setting (default none: the worker sees its whole history)")
    batch_size: int = option(1, flag="--questions-per-batch", type=positive_int, metavar="N",
                             help="questions per executor batch (default {default}); each batch's questions still "
                                  "generate one call at a time, the manager/worker nesting does not step questions "
                                  "together (docs/runner.md)")
    resume: bool = option(False, flag="--resume", action="store_true",
                          help="deprecated: a run continues OUT by default (finished questions skipped, partial runs "
                               "replayed)")
