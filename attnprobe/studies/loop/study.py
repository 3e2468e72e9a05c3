"""Run the settings side by side on one question set and write the study's tables.

``OUT/study.json`` (paths: :class:`attnprobe.studies.loop.layout.StudyLayout`; config, per-setting summaries with CIs, paired comparisons, per-question outcomes, and
``results``: the stamp of every result summarised, per setting and question) and ``OUT/study.md`` (the
table, then the attention section of ``attnprobe study attention`` once that has run and only while it was
computed from the same results: :mod:`attnprobe.studies.loop.attention`), rewritten atomically after every
run of the study from every result on disk made from the current inputs; ``OUT/<setting>/calls.jsonl``
gathers the recorded calls of those results in question order (one file to capture; empty when none).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attnprobe.agents.context import Setting
from attnprobe.agents.policies import setting_rules
from attnprobe.execution.study import Counts, Outcome, Plan, StudyBase
from attnprobe.io import atomic_write_text, finite_json, write_jsonl
from attnprobe.io.options import option, positive_int
from attnprobe.io.settings import RECORDED_GENERATION_LIMIT
from attnprobe.io.urls import redact
from attnprobe.results.caveats import observations_with_passage, structured_replies, study_caveats
from attnprobe.results.layout import CaptureLayout
from attnprobe.stats import STUDY_RESAMPLES
from attnprobe.studies.loop.agents import LoopConfig
from attnprobe.studies.loop.attention_report import results_stamps, with_attention
from attnprobe.studies.loop.in_loop import captured_in_the_loop
from attnprobe.studies.loop.job import InterferenceJob, load_results
from attnprobe.studies.loop.layout import HISTORY, StudyLayout
from attnprobe.studies.loop.metrics import markdown, summarize
from attnprobe.studies.loop.scoring import scorer_label
from attnprobe.studies.loop.validity import invalid_actions

log = logging.getLogger(__name__)

# the settings a study runs when none is given: the baseline plus the scaffold's seed settings
DEFAULT_SETTINGS = {"ircot": ["none", "ircot:o", "ircot:oq", "ircot:oqp", "refine:bm25:3"],
                    "seed002": ["none", "mask:5"]}
# --option names of LoopConfig's fields (the settings record names them in its refusal line)
OPTION_NAMES = {RECORDED_GENERATION_LIMIT: "--max-new-tokens", "prompts": "the prompt templates (fingerprint)",
                "final_call": "the final answer call", "model": "--model/--served-model",
                "structured_actions": "--structured-actions", "ircot_form": "--ircot-form"}


def write_study(out: Path, questions: Sequence[dict], settings: Sequence[str], config: LoopConfig, *,
                baseline: str | None = None, n_boot: int = STUDY_RESAMPLES, seed: int = 0, model: str | None = None) -> dict:
    """Summarise every result in ``out`` made from the current inputs (whichever run wrote it: a rerun
    that finishes nothing leaves the numbers as they were) and write study.json, study.md and each
    setting's calls.jsonl (only the calls of those results)."""
    out = Path(out)
    layout = StudyLayout(out)
    by = load_results(out, settings, questions, config, model)
    stamps = {s: {r["question_id"]: r["inputs"] for r in by[s]} for s in settings}
    baseline = baseline or settings[0]
    summary = summarize(by, baseline, n_boot=n_boot, seed=seed)
    models = sorted({r.get("model") or "?" for rs in by.values() for r in rs})
    label = scorer_label(config.judge)
    rules = {part: rule for s in settings for part, rule in setting_rules(s).items()}  # masking rule per policy
    study = {"config": config.to_dict(), "settings": list(settings), "policy_rules": rules, "models": models,
             "scorer": label,
             "questions_total": len(questions), **summary, "results": stamps}
    calls = {s: [rec for _, _, rec in layout.stamped(s, stamps[s])] for s in settings}  # the results' own calls
    if config.structured_actions:  # every reply recorded as structured, checked against its grammar
        study["structured_replies"] = structured_replies(c for cs in calls.values() for c in cs)
    study["invalid_actions"] = invalid_actions(calls)  # replies that were no valid action, per setting
    study["observations"] = {s: observations_with_passage(rec for _, _, rec in layout.stamped(s, stamps[s], HISTORY))
                             for s in settings}  # what each setting's agent retrieved, passages or nothing
    in_loop = {s: {"captured": captured_in_the_loop(CaptureLayout(layout.capture_dir(s)).folder(str(c.get("id")))
                                                    for c in calls[s]),
                   "calls": len(calls[s])} for s in settings}  # --capture-in-loop, counted from the capture folders
    if any(v["captured"] for v in in_loop.values()):
        study["captured_in_the_loop"] = in_loop
    study["caveats"] = study_caveats(study, calls)  # "retrieved nothing" from what the policy could act on
    # settings named without their refiner URLs' credentials (the folders are too: slug), as study.md names them
    atomic_write_text(layout.study_json, redact(json.dumps(finite_json(study), indent=1, ensure_ascii=False)))
    md = markdown(summary, scaffold=config.label, scorer=label, model=", ".join(models) or None,
                  caveats=study["caveats"], structured=config.structured_actions,
                  observations=study["observations"], in_loop=study.get("captured_in_the_loop"))
    # the attention section, once it is run, while it matches these results
    atomic_write_text(layout.study_md, with_attention(md, out, results_stamps(stamps)))
    for s in settings:
        path = layout.calls_file(s)
        if calls[s] or path.exists():  # never an old file beside new results
            write_jsonl(path, calls[s])
    return study


@dataclass(frozen=True)
class InterferenceOptions:
    """What ``attnprobe study interference`` takes; its own options declared here (the loop config's on
    :class:`~attnprobe.studies.loop.agents.LoopConfig`). The questions: ``questions_file`` (read by the plan,
    the first ``limit``) or ``questions`` already read; ``settings``: the settings to run side by side (one
    spelling each: mask:05 is mask:5; parsed :class:`~attnprobe.agents.context.Setting` values, or specs a
    Python caller passes, parsed by the plan); ``baseline``: the one the others are compared with (default the
    first); ``model``: the label results are stamped with; ``batch_size``: episodes stepped together
    (:mod:`attnprobe.studies.loop.rollout`; no part of any stamp; None: 1, or the CLI's --concurrency with an
    endpoint); ``endpoint``: generation goes through an OpenAI-compatible endpoint (which takes messages,
    not token ids); ``in_loop``: capture every call while generating it
    (:class:`attnprobe.studies.loop.in_loop.InLoopOptions`, built from ``--capture-in-loop``)."""

    out: Path
    settings: Sequence[Setting | str] | None = option(
        None, flag="--policy", aliases=("--context-policy",), action="append", metavar="SETTING",
        help="a setting to run; repeat it for more settings, side by side; compose policies within one setting with "
             "+ (e.g. ircot:oq+refine:bm25:3); default: none plus the scaffold's seed settings")
    config: LoopConfig = field(default_factory=LoopConfig)
    questions: Sequence[dict] | None = None
    questions_file: Path | None = option(
        None, flag="questions", help="JSONL question set (default fields: question, golden_answers / answer)")
    limit: int | None = option(None, flag="--limit", type=positive_int, help="only the first N questions")
    baseline: Setting | str | None = option(None, flag="--baseline",
                                  help="the setting the others are compared with (default: the first)")
    force: bool = False
    n_boot: int = option(STUDY_RESAMPLES, flag="--bootstrap", type=positive_int, metavar="BOOTSTRAP",
                         help="bootstrap resamples for CIs (default {default})")
    model: str | None = None
    batch_size: int | None = option(
        None, flag="--episodes-per-batch", type=positive_int, metavar="N",
        help="episodes (setting x question) in flight, stepped together: one batched model call per turn; records "
             "do not depend on it (default 1, or --concurrency N with --generator openai)")
    endpoint: bool = False
    capture_in_loop: bool = option(
        False, flag="--capture-in-loop", action="store_true",
        help="capture every recorded call's attention from the agent's own forward passes while it generates (the "
             "decision in the call's prefill, the reasoning start at the decode step that feeds it; --queries and "
             "--layers as 'study attention'), written where 'study attention' writes its captures, which then "
             "prefills nothing for them (docs/loop.md, 'Captured in the loop'). In process only (--generator "
             "transformers, or vllm: one engine generates and captures; 'study attention' then needs --backend "
             "vllm to find those captures made with its settings): a served model (--generator openai) returns text, not its attention, so its calls are "
             "captured afterwards by 'study attention'")
    in_loop: Any = None  # --capture-in-loop's InLoopOptions (attnprobe.studies.loop.in_loop); no part of any stamp


class InterferenceStudy(StudyBase):
    """Every unfinished (setting, question) on the executor, then the study's files (:func:`write_study`).
    A folder whose results were made with another loop config or ``model`` is refused before anything runs
    unless ``force`` (the options are recorded once an item is finished); settings may be added freely."""

    name = "study interference"
    folder = "study folder"
    Options, Layout = InterferenceOptions, StudyLayout

    def plan(self, options: InterferenceOptions, layout: StudyLayout) -> Plan:
        from attnprobe.agents.context import as_setting, parse_settings
        from attnprobe.agents.questions import read_questions
        from attnprobe.agents.search import make_search
        from attnprobe.studies.loop.scoring import Scorer

        o, config = options, options.config
        # Setting values (the CLI parsed them; a Python caller's specs are parsed here): one spelling per setting,
        # so one folder; two spellings of one setting refused; exit 2 on a bad one
        settings = parse_settings(o.settings or DEFAULT_SETTINGS[config.scaffold])
        baseline = as_setting(o.baseline) if o.baseline else None
        if baseline and baseline not in settings:
            raise ValueError(f"--baseline {baseline.spec!r} is not one of the settings "
                             f"({', '.join(s.spec for s in settings)})")
        Scorer(config.judge)  # a bad --judge fails here
        questions = list(o.questions) if o.questions is not None else read_questions(o.questions_file)[: o.limit]
        if config.stream and o.endpoint:  # a chat endpoint takes messages, not token ids
            raise ValueError("--ircot-form stream (the ircot default: Search-R1's one token sequence) runs in "
                             "process (--generator transformers or vllm); against a served model use --ircot-form "
                             "chat")
        make_search(config.search, config.corpus)  # a missing corpus or key fails before the model loads
        # structured_actions always recorded here (false too), so switching it in a folder is refused, not a
        # silent rerun of every item; the stamps carry it only when on. The corpus is input, not an option
        # (like the questions): its content is in every item's stamp, so a changed corpus reruns the items
        # and a moved identical one does not; the record leaves it out
        wanted = {**{k: v for k, v in config.to_dict().items() if k != "corpus"},
                  "structured_actions": config.structured_actions, "model": o.model,
                  **({"ircot_form": config.ircot_form} if config.scaffold == "ircot" else {})}
        job = InterferenceJob(layout.folder, questions, settings, config, force=o.force, model=o.model,
                              batch_size=o.batch_size or 1, settings_record=wanted,  # recorded as its first item finishes
                              in_loop=o.in_loop)
        specs = [s.spec for s in settings]  # the study's files name each setting by its spec
        return Plan([[job]], stamp=wanted, names=OPTION_NAMES, data=(questions, specs, baseline and baseline.spec, job))

    def finish(self, options: InterferenceOptions, layout: StudyLayout, counts: Counts) -> Outcome:
        questions, settings, baseline, job = counts.plan.data
        study = write_study(layout.folder, questions, settings, options.config, baseline=baseline,
                            n_boot=options.n_boot, model=options.model)
        if options.in_loop is not None:  # from the files: a job run on a Ray replica keeps no count here
            n = {k: sum(v[k] for v in study.get("captured_in_the_loop", {}).values()) for k in ("captured", "calls")}
            log.info("capture in the loop: %d of %d recorded calls captured while generating, %d left to study "
                     "attention", n["captured"], n["calls"], n["calls"] - n["captured"])
        c = counts.total
        return Outcome(lines=[layout.study_md.read_text(encoding="utf-8")],
                       notes=[c.line("study interference", to=layout.study_md)], exit_code=c.exit_code, value=study)


INTERFERENCE = InterferenceStudy()
