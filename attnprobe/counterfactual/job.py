"""The counterfactual run as a job: one work item per step, every policy of the step in its batch.

The steps of one trajectory form one group (:class:`~attnprobe.execution.job.WorkItem`), so they
always run in one backend call whatever ``batch_size`` (which counts trajectories): their original
contexts are prefixes of each other and their policies' contexts share everything before the first
message a policy changes, so one prefix-sharing pass prefills each unique token once."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from attnprobe.agents.policies import Policy, parse_policy, policy_name
from attnprobe.agents.policy_specs import DEFAULT_MASK_POLICY
from attnprobe.capture.models import LoadedModel
from attnprobe.counterfactual.layout import CounterfactualLayout
from attnprobe.counterfactual.run import RunOptions, actions_chat, run_batch, settings_dict
from attnprobe.counterfactual.steps import Step, choose_steps, plan_steps
from attnprobe.counterfactual.store import clear_steps
from attnprobe.counterfactual.summary import QUERY_TABLES, markdown_table, summarize_dir, write_summary
from attnprobe.execution.job import JobBase, WorkItem
from attnprobe.execution.local import LocalExecutor
from attnprobe.io import recover_atomic_dirs
from attnprobe.io.options import option_flags
from attnprobe.io.settings import check_settings, finished_something, record_settings
from attnprobe.trajectory.schema import Trajectory

log = logging.getLogger(__name__)

OPTION_NAMES = {"spec": "--model", "backend": "--backend", "dtype": "--dtype", **option_flags(RunOptions)}


@dataclass
class CounterfactualJob(JobBase):
    """Every (step, policy) of ``steps`` into ``out``. ``policies``: specs (``"mask:5"``, parsed where
    the job runs, so a Ray replica needs nothing but the text) or policy objects; ``settings``: per
    policy name, :func:`settings_dict` of the model that runs it (made where the model is:
    ``executor.call(counterfactual_settings, names, opts)``). ``chat``: the next-action chat for
    ``opts.actions`` in this process; elsewhere ``prepare`` makes one from the replica's model."""

    out: Path
    steps: Sequence[Step]
    policies: list
    settings: dict[str, dict]
    opts: RunOptions = field(default_factory=RunOptions)
    batch_size: int = 1
    force: bool = False
    chat: Any = None
    stage: str = "counterfactual"
    unit: str = "step"

    def __post_init__(self) -> None:
        self.out = Path(self.out)
        self.layout = CounterfactualLayout(self.out)
        self.names = [policy_name(self._policy(p)) for p in self.policies]
        for s in self.steps:  # a symlinked trajectory or policy folder would take the writes out of OUT
            for n in self.names:
                self.layout.step_dir(s, n)  # refused there (OutsideFolder), before any work
        if self.force:
            clear_steps(self.out, self.steps, self.names)
            self.force = False  # cleared once here; a retried shard must not clear what it wrote

    @staticmethod
    def _policy(p) -> Policy:
        return parse_policy(p) if isinstance(p, str) else p

    def items(self) -> list[WorkItem]:
        out = []
        for s in self.steps:
            prefix = replace(s.trajectory, messages=s.trajectory.messages[: s.message_index + 1])
            out.append(WorkItem(key=f"{s.trajectory.id}#{s.key}", tokens=prefix.estimated_tokens() * (1 + len(self.names)),
                                describe={"trajectory_id": s.trajectory.id, "step": s.message_index}, data=s,
                                group=s.trajectory.id))
        return out

    def done(self, item: WorkItem, since: float | None = None) -> bool:
        return all(self.layout.step_done(item.data, n, self.settings[n], since=since) for n in self.names)

    @property
    def prepare_key(self) -> Any:
        return ("counterfactual", self.opts.actions)

    def prepare(self, model) -> tuple:
        chat = self.chat if self.chat is not None or not self.opts.actions else actions_chat(model)
        return model, chat, [self._policy(p) for p in self.policies]

    def run(self, state, batch: Sequence[WorkItem]) -> list[None]:
        model, chat, policies = state
        run_batch(model, [it.data for it in batch], policies, self.out, self.opts, chat)
        return [None] * len(batch)

    def finish(self) -> list[str]:
        parents = {self.layout.step_dir(s, n).parent for s in self.steps for n in self.names}
        return [p for parent in sorted(parents) if parent.is_dir() for p in recover_atomic_dirs(parent)]


def counterfactual_settings(model, names: list[str], opts: RunOptions) -> dict[str, dict]:
    """Per policy name, what a finished step must have been made with; refuses ``--actions`` for a
    model that cannot generate in process, before any work. Runs where the model is
    (``executor.call``)."""
    if opts.actions:
        actions_chat(model)
    return {n: settings_dict(model, n, opts) for n in names}


def run_counterfactuals(model: LoadedModel, trajectories: Sequence[Trajectory], policies: Sequence[Policy],
                        out: str | Path, *, opts: RunOptions | None = None, chat=None, min_past: int = 5,
                        include_actions: bool = False, turns: Sequence[int] | None = None,
                        max_steps: int | None = None, batch_size: int = 1, force: bool = False) -> dict[str, int]:
    """Run every policy at every chosen step of every trajectory into ``out`` in this process
    (resumable: finished (step, policy) folders with the same settings are skipped; failures go to
    ``out/errors.jsonl``): :class:`~attnprobe.counterfactual.job.CounterfactualJob` on the local
    executor. Every step of a trajectory shares one backend call; ``batch_size`` trajectories do
    (vLLM batches their prefills)."""
    opts = opts or RunOptions()
    names, steps = plan_steps(trajectories, policies, min_past=min_past, include_actions=include_actions,
                              turns=turns, max_steps=max_steps)
    settings = {n: settings_dict(model, n, opts) for n in names}
    job = CounterfactualJob(Path(out), steps, list(policies), settings, opts, batch_size=batch_size, force=force,
                            chat=chat)
    return LocalExecutor(lambda: model, progress=opts.progress).run(job)


def options_record(opts: RunOptions, model: dict | None = None) -> dict:
    """What ``out``'s settings record (:func:`attnprobe.io.settings.check_settings`) holds for a
    counterfactual run: the model (``spec``/``backend``/``dtype``, when the caller knows them) and every
    option that changes a step's record. A rerun without ``--actions`` into a folder made with it is
    refused (not a silent replacement of the finished steps' next-action data) unless ``--force``."""
    return {**(model or {}), "rendering": opts.rendering, "max_tokens": opts.max_tokens,
            "layers": None if opts.layers is None else list(opts.layers),
            # a chunk changes scores only by float rounding: an automatic one (None) resumes any folder
            **({"chunk_size": opts.chunk_size} if opts.chunk_size else {}),
            "actions": opts.actions, "max_new_tokens": opts.max_new_tokens if opts.actions else None,
            "logprob": opts.logprob}


def run_steps(executor, out: str | Path, steps: Sequence[Step], names: Sequence[str], specs: Sequence[str],
              opts: RunOptions, *, batch_size: int = 1, force: bool = False, model: dict | None = None,
              min_past: int | None = None, models: str | None = None) -> dict:
    """Planned ``steps`` (:func:`plan_steps`) under every policy of ``specs`` on ``executor`` (any executor;
    resumable) into ``out``, then the summary of ``out``, written to OUT/summary.json and OUT/summary.md
    (:func:`~attnprobe.counterfactual.summary.write_summary`; ``min_past`` and ``models``, "capture model X,
    agent model Y" when the capture model is not the agent's, are named there): ``{"counts", "summary",
    "skipped", "markdown": {query: table}}``. Other options than ``out`` was made with are refused before the
    model loads unless ``force`` (:func:`options_record`). The settings are made where the model is."""
    check_settings(out, "counterfactual", options_record(opts, model), force=force, names=OPTION_NAMES)
    Path(out).mkdir(parents=True, exist_ok=True)  # its summary is written whatever the run finished
    settings = executor.call(counterfactual_settings, list(names), replace(opts, progress=False))
    job = CounterfactualJob(Path(out), list(steps), list(specs), settings, opts, batch_size=batch_size, force=force)
    counts = executor.run(job)
    if finished_something(counts):  # recorded only once a step is finished (a failed run blocks no rerun)
        record_settings(out, "counterfactual", options_record(opts, model), force=force)
    skipped: list = []
    summary = summarize_dir(out, skipped=skipped) if Path(out).is_dir() else {}
    for where, why in skipped:
        log.warning("summary: skipped %s: %s", where, why)
    if Path(out).is_dir():
        write_summary(out, summary, min_past=min_past, skipped=skipped, models=models)
    return {"counts": counts, "summary": summary, "skipped": skipped,
            "markdown": {q: markdown_table(summary, q) for q in QUERY_TABLES}}


def run_on_executor(executor, out: str | Path, trajectories: Sequence[Trajectory], specs: Sequence[str],
                    opts: RunOptions, *, min_past: int, batch_size: int = 1, force: bool = False,
                    model: dict | None = None, models: str | None = None) -> dict:
    """Every (step, policy) of ``trajectories`` with >= ``min_past`` past turns (:func:`run_steps`), as
    ``{"steps", "min_past", **run_steps(...)}``. No step qualifies: ``steps`` 0, nothing run and no model
    loaded (callers that compose studies report it instead of failing)."""
    if not any(choose_steps(t, min_past=min_past) for t in trajectories):
        return {"steps": 0, "min_past": min_past}
    names, steps = plan_steps(trajectories, list(specs), min_past=min_past)
    return {"steps": len(steps), "min_past": min_past,
            **run_steps(executor, out, steps, names, specs, opts, batch_size=batch_size, force=force, model=model,
                        min_past=min_past, models=models)}


@dataclass(frozen=True)
class StepChoice:
    """Which steps a counterfactual run takes, and under which policies (``attnprobe counterfactual``'s
    and ``study masking``'s options): ``min_past`` None = the first step at which the policies can act."""

    policies: Sequence[str] = (DEFAULT_MASK_POLICY,)
    min_past: int | None = None
    include_actions: bool = False
    turns: Sequence[int] | None = None
    max_steps: int | None = None

    def plan(self, files: Sequence[Path]) -> tuple[list[str], int, list[str], list[Step]]:
        """(policy specs, min_past, policy names, steps): the trajectories read and every policy and step
        option checked, with no model (a study calls it before its first stage too)."""
        from attnprobe.agents.policies import default_min_past
        from attnprobe.agents.policy_specs import canonical_policy
        from attnprobe.trajectory.schema import load_files

        specs = [canonical_policy(s) for s in self.policies or [DEFAULT_MASK_POLICY]]  # one spelling: mask:05 is mask:5
        trajs = load_files(files)  # ids unique across files: two files' steps must not share one folder
        min_past = self.min_past if self.min_past is not None else default_min_past(specs)
        names, steps = plan_steps(trajs, specs, min_past=min_past, include_actions=self.include_actions,
                                  turns=self.turns, max_steps=self.max_steps)
        return specs, min_past, names, steps


def run_files(files: Sequence[Path], out: Path, choice: StepChoice, opts: RunOptions, open_executor, *,
              batch_size: int = 1, force: bool = False, model: dict | None = None) -> dict:
    """The steps ``choice`` takes from ``files`` (refused before any model loads), run resumably into
    ``out`` under its lock on the executor ``open_executor()`` opens; :func:`run_steps`'s report."""
    from attnprobe.io import ensure_writable_dir, hold_dir_lock

    specs, min_past, names, steps = choice.plan(files)
    log.info("counterfactual: %d steps with >= %d past turns%s", len(steps), min_past,
             "" if choice.min_past is not None else " (the default for these policies)")
    ensure_writable_dir(out)
    with hold_dir_lock(out), open_executor() as ex:
        report = run_steps(ex, out, steps, names, specs, opts, batch_size=batch_size, force=force, model=model,
                           min_past=min_past)
    counts = report["counts"]
    log.info("counterfactual: %d steps done, %d skipped (already done), %d failed; summary in %s",
             counts["done"], counts["done_before"], counts["failed"], CounterfactualLayout(Path(out)).summary_md)
    return report
