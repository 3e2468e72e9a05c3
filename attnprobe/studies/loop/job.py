"""The interference study as a job: one work item per (setting, question), on any executor.

Files under ``OUT/<setting slug>/`` (slug: ``:`` -> ``-``), written by whoever runs the item, each atomically,
the result last (its presence means the item is finished):

- ``calls/<qid>.jsonl``   every model call as a trajectory, exactly as sent (``attnprobe capture`` /
  ``attnprobe counterfactual`` read it as is);
- ``history/<qid>.jsonl`` the full history (no masking, no refinement), one trajectory; every call's
  ``meta.history`` points into it;
- ``results/<qid>.json``  the outcome (answer, correctness, ART, tool calls, tokens, context length, time)
  with the settings that made it: an item is done when that file exists with the same setting and
  loop config, which includes a fingerprint of the scaffold's prompt templates (a changed option or
  template reruns it; ``--force`` reruns everything). The model is not compared: use another OUT per model.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnprobe.agents.policies import setting_rules
from attnprobe.errors import AttnprobeError
from attnprobe.execution.job import JobBase, WorkItem, written_since
from attnprobe.io import atomic_write_text, inside, load_json, write_jsonl
from attnprobe.studies.loop.agents import LoopConfig, run_question
from attnprobe.studies.loop.context import parse_setting, slug

_SEARCH: dict[tuple, Any] = {}  # one search index per process (Ray replicas build their own)


def search_backend(kind: str, corpus: str | None):
    from attnprobe.agents.search import make_search

    key = (kind, corpus)
    if key not in _SEARCH:
        _SEARCH[key] = make_search(kind, corpus)
    return _SEARCH[key]


def setting_dir(out: Path, spec: str) -> Path:
    return Path(out) / slug(spec)


def result_path(out: Path, spec: str, qid: str) -> Path:
    return setting_dir(out, spec) / "results" / f"{qid}.json"


SETTING_PARTS = ("calls", "history", "results", "calls.jsonl", "capture", "counterfactual")  # under <slug>/


def check_study_folder(out: Path, settings: Sequence[str]) -> None:
    """One line (:class:`attnprobe.io.OutsideFolder`) when a setting's folder, or a part of it that the
    study writes or reads (:data:`SETTING_PARTS`), is a symlink: a received study folder must not make us
    write or read outside it. Checked before any model loads."""
    for s in settings:
        for part in SETTING_PARTS:
            inside(out, setting_dir(out, s) / part)


def read_result(path: Path) -> dict | None:
    """A finished item's result, or None when missing, a symlink (not followed) or unreadable (then the
    item is redone, and the symlink replaced by the new result)."""
    if path.is_symlink() or not path.is_file():
        return None
    try:
        rec = load_json(path, error=lambda m, path, line: AttnprobeError(m))
    except AttnprobeError:
        return None
    return rec if isinstance(rec, dict) else None


@dataclass
class InterferenceJob(JobBase):
    """Run every (setting, question) not finished in ``out`` with ``config``."""

    out: Path
    questions: Sequence[dict]
    settings: Sequence[str]
    config: LoopConfig
    force: bool = False
    stage: str = "interference"
    unit: str = "run"

    def __post_init__(self) -> None:
        self.out = Path(self.out)
        for s in self.settings:
            parse_setting(s)  # a bad spec fails here, before any model is loaded
        check_study_folder(self.out, self.settings)

    def items(self) -> list[WorkItem]:
        return [WorkItem(key=f"{slug(s)}/{q['id']}", tokens=len(q["question"]) // 4 + 1,
                         describe={"setting": s, "question_id": q["id"]}, data=(s, q))
                for q in self.questions for s in self.settings]  # question-major: a partial study is paired

    def done(self, item: WorkItem, since: float | None = None) -> bool:
        spec, q = item.data
        path = result_path(self.out, spec, q["id"])
        if not written_since(path, since):
            return False
        rec = read_result(path)
        return finished_with(rec, spec, self.config)

    @property
    def prepare_key(self) -> Any:
        return ("interference", self.config.scaffold)

    def prepare(self, model) -> Any:
        if hasattr(model, "complete"):
            return model
        from attnprobe.generation.transformers_chat import TransformersChat  # a Ray replica's loaded model

        return TransformersChat(model, stop_at_call=False if self.config.scaffold == "seed002" else None)

    def run(self, chat, batch: Sequence[WorkItem]) -> list[dict]:
        from attnprobe.studies.loop.scoring import Scorer

        search = search_backend(self.config.search, self.config.corpus)
        scorer = Scorer(self.config.judge)
        out = []
        for item in batch:
            spec, q = item.data
            folder = setting_dir(self.out, spec)
            result, calls, history = run_question(chat, search, parse_setting(spec), self.config, q,
                                                  run_id=f"{slug(spec)}/{q['id']}", scorer=scorer)
            write_jsonl(folder / "calls" / f"{q['id']}.jsonl", calls)
            write_jsonl(folder / "history" / f"{q['id']}.jsonl", [history])
            atomic_write_text(result_path(self.out, spec, q["id"]), json.dumps(result, indent=1, ensure_ascii=False))
            out.append(result)
        return out


def finished_with(rec: dict | None, spec: str, config: LoopConfig) -> bool:
    """A result made with this setting, config and masking rule (a mask:K result from before the released
    rule, issue 26, has no ``policy_rules`` and is run again)."""
    return (rec is not None and rec.get("setting") == spec and rec.get("config") == config.to_dict()
            and rec.get("policy_rules", {}) == setting_rules(spec))


def load_results(out: Path, settings: Sequence[str], questions: Sequence[dict], config: LoopConfig) -> dict:
    """Finished results per setting, in question order (items not finished with ``config`` are left out)."""
    by = {}
    for s in settings:
        rows = []
        for q in questions:
            rec = read_result(result_path(out, s, q["id"]))
            if finished_with(rec, s, config):
                rows.append(rec)
        by[s] = rows
    return by
