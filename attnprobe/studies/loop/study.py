"""Run the settings side by side on one question set and write the study's tables.

``OUT/study.json`` (config, per-setting summaries with CIs, paired comparisons, per-question outcomes) and
``OUT/study.md`` (the table, then the attention section of ``attnprobe study attention`` once that has run:
:mod:`attnprobe.studies.loop.attention`), rewritten atomically after every run of the study; ``OUT/<setting>/calls.jsonl``
gathers that setting's recorded calls in question order (one file to capture).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from attnprobe.agents.policies import setting_rules
from attnprobe.io import atomic_write_text, finite_json, read_records, write_jsonl
from attnprobe.studies.loop.agents import LoopConfig
from attnprobe.studies.loop.attention_report import with_attention
from attnprobe.studies.loop.job import InterferenceJob, load_results, setting_dir
from attnprobe.studies.loop.metrics import markdown, summarize
from attnprobe.studies.loop.scoring import scorer_label


def write_study(out: Path, questions: Sequence[dict], settings: Sequence[str], config: LoopConfig, *,
                baseline: str | None = None, n_boot: int = 2000, seed: int = 0) -> dict:
    """Summarise what is finished in ``out`` and write study.json, study.md and each setting's calls.jsonl."""
    out = Path(out)
    by = load_results(out, settings, questions, config)
    baseline = baseline or settings[0]
    summary = summarize(by, baseline, n_boot=n_boot, seed=seed)
    models = sorted({r.get("model") or "?" for rs in by.values() for r in rs})
    label = scorer_label(config.judge)
    rules = {part: rule for s in settings for part, rule in setting_rules(s).items()}  # masking rule per policy
    study = {"config": config.to_dict(), "settings": list(settings), "policy_rules": rules, "models": models,
             "scorer": label,
             "questions_total": len(questions), **summary}
    atomic_write_text(out / "study.json", json.dumps(finite_json(study), indent=1, ensure_ascii=False))
    md = markdown(summary, scaffold=config.scaffold, scorer=label, model=", ".join(models) or None)
    atomic_write_text(out / "study.md", with_attention(md, out))  # the attention section, once it is run
    for s in settings:
        folder = setting_dir(out, s)
        calls = [c for r in by[s] if not (folder / "calls" / f"{r['question_id']}.jsonl").is_symlink()
                 for c in read_records(folder / "calls" / f"{r['question_id']}.jsonl", missing_ok=True)]
        if calls:
            write_jsonl(folder / "calls.jsonl", calls)
    return study


def run_study(executor, out: Path, questions: Sequence[dict], settings: Sequence[str], config: LoopConfig, *,
              baseline: str | None = None, force: bool = False, n_boot: int = 2000) -> tuple[dict, dict]:
    """Run every unfinished (setting, question) on ``executor`` then write the study; returns (counts, study)."""
    job = InterferenceJob(Path(out), list(questions), list(settings), config, force=force)
    counts = executor.run(job)
    return counts, write_study(Path(out), questions, settings, config, baseline=baseline, n_boot=n_boot)
