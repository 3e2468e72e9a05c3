"""The interference study as a job: one work item per (setting, question), on any executor.

A batch of items (``batch_size``, ``--batch-size``) runs as episodes stepped together
(:mod:`attnprobe.studies.loop.rollout`); each item is written as soon as its episode finishes, and what is
written does not depend on the batch (timings aside).

Files under ``OUT/<setting slug>/`` (slug: ``:`` -> ``-``, one-to-one: :func:`.context.slug`; every path from
:class:`attnprobe.studies.loop.layout.StudyLayout`), written by whoever runs the item, each atomically, the
result last (its presence means the item is finished, :meth:`~attnprobe.studies.loop.layout.StudyLayout.done`):

- ``calls/<qid>.jsonl``   every model call as a trajectory, exactly as sent (``attnprobe capture`` /
  ``attnprobe counterfactual`` read it as is);
- ``history/<qid>.jsonl`` the full history (no masking, no refinement), one trajectory; every call's
  ``meta.history`` points into it;
- ``results/<qid>.json``  the outcome (answer, correctness, ART, tool calls, tokens, context length, time)
  with the settings that made it and ``inputs``, the stamp of everything that decided it
  (:func:`inputs_stamp`: the question's text and gold answers, the setting and its masking rule, the loop
  config with its prompt-template fingerprint, the model): an item is done when that file exists with the
  same stamp. A changed question or gold answer reruns that item; a changed global option (model, loop
  config) is refused before anything runs (:func:`attnprobe.io.settings.check_settings`, in
  :func:`attnprobe.studies.loop.study.run_study`) unless ``--force``, which reruns everything. Every
  recorded call carries the stamp too (``meta.inputs``), so ``study attention`` uses only the calls of
  current results.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnprobe.agents.context import Setting, as_setting
from attnprobe.agents.policies import setting_rules
from attnprobe.execution.job import WorkItem
from attnprobe.generation.factory import ChatJob
from attnprobe.io import atomic_write_text, write_jsonl
from attnprobe.io.urls import redact
from attnprobe.studies.loop.agents import LoopConfig
from attnprobe.studies.loop.context import slug
from attnprobe.studies.loop.layout import StudyLayout

log = logging.getLogger(__name__)


@dataclass
class InterferenceJob(ChatJob):
    """Run every (setting, question) not finished in ``out`` with ``config``. ``settings``: parsed values (a
    spec is parsed here, for a Python caller); items, records and folders name each by its spec."""

    out: Path
    questions: Sequence[dict]
    settings: Sequence[Setting]
    config: LoopConfig
    force: bool = False
    model: str | None = None  # what generates (a label: path or served model name), part of every stamp
    batch_size: int = 1  # episodes in flight (--batch-size); no part of any stamp: records do not depend on it
    # the options the folder's settings record gets once the first item is finished (collect, in the process
    # that started the job: a killed run that finished an item has recorded them); None: not recorded here
    settings_record: dict | None = None
    # capture every call's attention while generating it (--capture-in-loop; attnprobe.studies.loop.in_loop);
    # no part of any stamp: it changes no record, only adds the captures study attention would make
    in_loop: Any = None  # an InLoopOptions, or None
    stage: str = "interference"
    unit: str = "run"
    bar_unit = "call"  # the bar counts model calls (work), not only finished episodes

    def __post_init__(self) -> None:
        self.out = Path(self.out)
        self.settings = [as_setting(s) for s in self.settings]  # a bad spec fails here, before any model loads
        self.layout.check([s.spec for s in self.settings])

    @property
    def layout(self) -> StudyLayout:
        return StudyLayout(self.out)

    def items(self) -> list[WorkItem]:
        return [WorkItem(key=f"{slug(s.spec)}/{q['id']}", tokens=len(q["question"]) // 4 + 1,
                         describe={"setting": s.spec, "question_id": q["id"]}, data=(s.spec, q))
                for q in self.questions for s in self.settings]  # question-major: a partial study is paired

    def setting(self, spec: str) -> Setting:
        """The parsed setting of an item's spec (never parsed again)."""
        return next(s for s in self.settings if s.spec == spec)

    def bar_units(self, item: WorkItem) -> int:
        """The most model calls an episode makes (the bar's bound): ``max_turns``, plus IRCoT's final call."""
        return self.config.max_turns + int(self.config.scaffold == "ircot" and self.config.final_call)

    def done(self, item: WorkItem, since: float | None = None) -> bool:
        spec, q = item.data
        return self.layout.done(spec, q["id"], inputs_stamp(q, spec, self.config, self.model), since=since,
                                fields=recorded_fields(spec, self.config))

    def collect(self, item: WorkItem, result: Any) -> None:
        """An item is finished: the folder's settings record gets this run's options (once per run)."""
        if self.settings_record is not None:
            from attnprobe.io.settings import record_settings

            record_settings(self.out, "study interference", self.settings_record, force=self.force)
            self.settings_record = None

    @property
    def prepare_key(self) -> Any:
        return ("interference", self.config.scaffold)

    @property
    def chat_options(self) -> dict:
        """How a loaded model (a Ray replica's) becomes this job's chat (:class:`ChatJob`): seed 002's replies may
        hold several calls, so generation does not stop at the first."""
        return {"stop_at_call": False if self.config.scaffold == "seed002" else None}

    def run(self, chat, batch: Sequence[WorkItem]) -> list[dict]:
        """Run the batch's episodes together (:func:`attnprobe.studies.loop.rollout.rollout`: one batched model
        call per turn) and write each item's records as soon as its episode finishes."""
        from attnprobe.agents.search import shared_search
        from attnprobe.studies.loop.agents import Loop, question_records
        from attnprobe.studies.loop.rollout import rollout
        from attnprobe.studies.loop.scoring import Scorer

        search = shared_search(self.config.search, self.config.corpus)
        scorer = Scorer(self.config.judge)
        if self.in_loop is not None:
            from attnprobe.studies.loop.in_loop import CapturingChat

            chat = CapturingChat(chat, self.in_loop)
        loops, specs = [], {}
        for item in batch:
            spec, q = item.data
            run_id = f"{slug(spec)}/{q['id']}"
            specs[run_id] = spec
            loops.append(Loop(chat, search, self.setting(spec), self.config, run_id=run_id, question=q))
            if self.in_loop is not None:
                chat.loops[run_id] = loops[-1]
        results: dict[str, dict] = {}

        def write(loop, seconds: float) -> None:
            spec, q = specs[loop.run_id], loop.question
            result, calls, history = question_records(loop, scorer, seconds)
            stamp = inputs_stamp(q, spec, self.config, self.model)
            result["inputs"] = stamp
            for c in [*calls, history]:
                c.setdefault("meta", {})["inputs"] = stamp
            layout = self.layout
            write_jsonl(layout.calls(spec, q["id"]), calls)
            write_jsonl(layout.history(spec, q["id"]), [history])
            if self.in_loop is not None:  # before the result: a finished item has its captures
                self._write_captures(chat, loop.run_id, spec, calls)
            atomic_write_text(layout.result(spec, q["id"]), json.dumps(result, indent=1, ensure_ascii=False))
            results[loop.run_id] = result

        def named(text: str) -> None:  # one episode: its calls, named as a sequential run always named them
            self.note(f"{specs[loops[0].run_id]} {loops[0].question['id']}: {text}")

        rollout(chat, loops, on_done=write, note=named if len(loops) == 1 else self.note,
                on_call=lambda loop: self.advance(loop.run_id))  # run_id is the item's key
        return [results[lp.run_id] for lp in loops]

    def _write_captures(self, chat, run_id: str, spec: str, calls: list[dict]) -> None:
        """The episode's calls captured in the loop into ``OUT/<setting>/capture/`` (the folders ``study attention``
        writes); a call whose rows the loop did not score is left to ``study attention`` (one log line)."""
        from attnprobe.results.layout import CaptureLayout
        from attnprobe.studies.loop.in_loop import as_read, capture_call

        caps = chat.take(run_id)
        if len(caps) != len(calls):
            log.warning("%s: %d calls but %d captures in the loop; left to study attention", run_id, len(calls),
                        len(caps))
            return
        folders = CaptureLayout(self.layout.capture_dir(spec))  # where study attention's capture job writes
        for i, rec in enumerate(calls):
            traj = as_read(rec)  # as study attention reads it
            res = capture_call(chat.loaded, traj, caps[i], caps, self.in_loop, self.in_loop.weights)
            if isinstance(res, str):
                log.info("capture in the loop: %s; left to study attention", res)
                continue
            res.save(folders.folder(traj.id))


def inputs_stamp(question: dict, spec: str, config: LoopConfig, model: str | None = None) -> str:
    """The digest of everything that decides one item's result: the question's text, gold answers and
    type, the setting and its masking rule, the loop config (prompt-template fingerprint included) and
    the model label. Equal stamps: the same inputs, so the result on disk is this item's."""
    what = {"question": question.get("question"), "answers": question.get("answers"),
            "type": question.get("type"), "setting": spec, "policy_rules": setting_rules(spec),
            "config": config.to_dict(), "model": model}
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:20]


def recorded_fields(spec: str, config: LoopConfig) -> dict:
    """What a result of ``spec`` under ``config`` records besides its stamp, checked by the done rule too: the
    setting, the loop config and its masking rule (a result from before the released mask:K rule, issue 26,
    records none and is run again)."""
    return {"setting": redact(spec), "config": config.to_dict(), "policy_rules": setting_rules(spec)}  # as written


def finished_with(rec: dict | None, spec: str, config: LoopConfig, question: dict, model: str | None = None) -> bool:
    """A result made from these inputs (:func:`inputs_stamp`): this setting, config, masking rule, model,
    question text and gold answers (:meth:`StudyLayout.finished`). A result without a stamp (an older
    attnprobe) is run again."""
    return StudyLayout.finished(rec, inputs_stamp(question, spec, config, model), recorded_fields(spec, config))


def load_results(out: Path, settings: Sequence[str], questions: Sequence[dict], config: LoopConfig,
                 model: str | None = None) -> dict:
    """Finished results per setting, in question order: every result on disk made from the current inputs
    (:func:`finished_with`), whichever run wrote it."""
    layout = StudyLayout(out)
    by = {}
    for s in settings:
        rows = []
        for q in questions:
            rec = layout.read_result(s, q["id"])
            if finished_with(rec, s, config, q, model):
                rows.append(rec)
        by[s] = rows
    return by
