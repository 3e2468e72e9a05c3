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
from pathlib import Path

from attnprobe.agents.policies import setting_rules
from attnprobe.io import atomic_write_text, finite_json, write_jsonl
from attnprobe.io.settings import check_settings, finished_something, record_settings
from attnprobe.io.urls import redact
from attnprobe.results.caveats import observations_with_passage, structured_replies, study_caveats
from attnprobe.studies.loop.agents import LoopConfig
from attnprobe.studies.loop.attention_report import results_stamps, with_attention
from attnprobe.studies.loop.job import InterferenceJob, load_results
from attnprobe.studies.loop.layout import HISTORY, StudyLayout
from attnprobe.studies.loop.metrics import markdown, summarize
from attnprobe.studies.loop.scoring import scorer_label
from attnprobe.studies.loop.validity import invalid_actions

log = logging.getLogger(__name__)

# --option names of LoopConfig's fields (the settings record names them in its refusal line)
OPTION_NAMES = {"max_tokens": "--max-new-tokens", "prompts": "the prompt templates (fingerprint)",
                "final_call": "the final answer call", "model": "--model/--served-model",
                "structured_actions": "--structured-actions", "ircot_form": "--ircot-form"}


def write_study(out: Path, questions: Sequence[dict], settings: Sequence[str], config: LoopConfig, *,
                baseline: str | None = None, n_boot: int = 2000, seed: int = 0, model: str | None = None) -> dict:
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
    study["caveats"] = study_caveats(study, calls)  # "retrieved nothing" from what the policy could act on
    # settings named without their refiner URLs' credentials (the folders are too: slug), as study.md names them
    atomic_write_text(layout.study_json, redact(json.dumps(finite_json(study), indent=1, ensure_ascii=False)))
    md = markdown(summary, scaffold=config.label, scorer=label, model=", ".join(models) or None,
                  caveats=study["caveats"], structured=config.structured_actions,
                  observations=study["observations"])
    # the attention section, once it is run, while it matches these results
    atomic_write_text(layout.study_md, with_attention(md, out, results_stamps(stamps)))
    for s in settings:
        path = layout.calls_file(s)
        if calls[s] or path.exists():  # never an old file beside new results
            write_jsonl(path, calls[s])
    return study


def run_study(executor, out: Path, questions: Sequence[dict], settings: Sequence[str], config: LoopConfig, *,
              baseline: str | None = None, force: bool = False, n_boot: int = 2000,
              model: str | None = None, batch_size: int = 1, in_loop=None) -> tuple[dict, dict]:
    """Run every unfinished (setting, question) on ``executor`` then write the study; returns (counts, study).
    A folder whose results were made with another loop config or ``model`` is refused before anything
    runs unless ``force`` (:func:`attnprobe.io.settings.check_settings`; the options are recorded only once an
    item is finished); settings may be added freely.
    ``batch_size``: episodes stepped together (:mod:`attnprobe.studies.loop.rollout`); no part of any stamp.
    ``in_loop``: capture every call while generating it (:class:`attnprobe.studies.loop.in_loop.InLoopOptions`,
    ``--capture-in-loop``); no part of any stamp."""
    # structured_actions always recorded here (false too), so switching it in a folder is refused, not a silent
    # rerun of every item; the stamps carry it only when on
    # the corpus is input, not an option (like the questions): its content is in every item's stamp, so a
    # changed corpus reruns the items and a moved identical one does not; the record leaves it out
    wanted = {**{k: v for k, v in config.to_dict().items() if k != "corpus"},
              "structured_actions": config.structured_actions, "model": model,
              **({"ircot_form": config.ircot_form} if config.scaffold == "ircot" else {})}
    check_settings(out, "study interference", wanted, force=force, names=OPTION_NAMES)
    job = InterferenceJob(Path(out), list(questions), list(settings), config, force=force, model=model,
                          batch_size=batch_size, settings_record=wanted, in_loop=in_loop)  # recorded as its first item finishes
    counts = executor.run(job)
    if in_loop is not None:
        log.info("capture in the loop: %d calls captured while generating, %d left to study attention",
                 job.in_loop_counts["captured"], job.in_loop_counts["left_post_hoc"])
    if finished_something(counts):  # and when every item was done before; a run that finished nothing (no
        record_settings(out, "study interference", wanted, force=force)  # model, every item failed): nothing
    return counts, write_study(Path(out), questions, settings, config, baseline=baseline, n_boot=n_boot, model=model)
