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
from attnprobe.counterfactual.layout import CounterfactualLayout
from attnprobe.counterfactual.run import RunOptions, actions_chat, run_batch, settings_dict
from attnprobe.counterfactual.steps import Step, plan_steps
from attnprobe.counterfactual.store import clear_steps
from attnprobe.execution.job import JobBase, WorkItem
from attnprobe.io import recover_atomic_dirs
from attnprobe.io.options import non_negative_int, option, option_flags, parse_int_list, positive_int
from attnprobe.trajectory.schema import Trajectory

log = logging.getLogger(__name__)

POLICY_HELP = ("context policy, repeatable: mask:K (seed 002 observation masking as its released scaffold does "
               "it: successful results older than the K-th most recent turn with a non-error call become "
               "'[Auto-archived browser result] tool=... | args: ...'), mask-obs:K (keep the K most recent "
               "observations), ircot:o | ircot:oq "
               "| ircot:oqp (seed 004 section 3.2), refine:bm25[:N] (seed 004 section 3.3: every round's "
               "observation refined with its own query, keep N sentences), refine-latest:bm25[:N] (the latest "
               "observation only), refine:openai:BASE_URL:MODEL; errors are never masked")
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


@dataclass(frozen=True)
class StepChoice:
    """Which steps a counterfactual run takes, and under which policies (``attnprobe counterfactual``'s
    and ``study masking``'s options, declared here): ``policies`` None = :data:`DEFAULT_MASK_POLICY`;
    ``min_past`` None = the first step at which the policies can act."""

    policies: Sequence[str] | None = option(None, flag="--policy", action="append", metavar="POLICY",
                                            help=POLICY_HELP)
    min_past: int | None = option(
        None, flag="--min-past", type=non_negative_int,
        help="steps with at least this many past turns (default: the first step at which the policy can act: K+1 "
             "for mask:K and mask-obs:K, 2 for IRCoT, 1 for refiners; the smallest when policies are mixed)")
    include_actions: bool = option(False, flag="--include-actions", action="store_true",
                                   help="also tool-call-only steps (no reasoning text)")
    turns: Sequence[int] | None = option(None, flag="--turns", type=parse_int_list,
                                         help="only these step turns, e.g. '5-8,12'")
    max_steps: int | None = option(None, flag="--max-steps", type=positive_int,
                                   help="at most this many steps per trajectory")

    def plan(self, files: Sequence[Path]) -> tuple[list, int, list[str], list[Step]]:
        """(policy specs, min_past, policy names, steps): the trajectories read and every policy and step
        option checked, with no model (a study calls it before its first stage too)."""
        from attnprobe.trajectory.schema import load_files

        self.specs()  # a bad policy is refused before the files are read
        return self.plan_trajectories(load_files(files))  # ids unique across files: one folder per step

    def specs(self) -> list:
        """The policies, each spec in its one spelling (mask:05 is mask:5); policy objects as given."""
        from attnprobe.agents.policy_specs import canonical_policy

        return [canonical_policy(s) if isinstance(s, str) else s for s in self.policies or [DEFAULT_MASK_POLICY]]

    def plan_trajectories(self, trajs: Sequence[Trajectory]) -> tuple[list, int, list[str], list[Step]]:
        """:meth:`plan` for trajectories already read. A policy is a spec (one spelling: mask:05 is
        mask:5) or, from Python, a policy object."""
        from attnprobe.agents.policies import default_min_past

        specs = self.specs()
        min_past = self.min_past if self.min_past is not None else default_min_past(specs)
        names, steps = plan_steps(trajs, specs, min_past=min_past, include_actions=self.include_actions,
                                  turns=self.turns, max_steps=self.max_steps)
        return specs, min_past, names, steps
