"""``attnprobe counterfactual``: per-step context counterfactuals (masking, IRCoT, refinement)."""

from __future__ import annotations

import logging
from pathlib import Path

from attnprobe.cli.options import (
    TrajectoryFiles,
    add_capture_options,
    add_cluster_options,
    add_hidden_alias,
    add_model_options,
    add_options,
    add_output_options,
    from_args,
    positive_int,
)

log = logging.getLogger(__name__)

def add_counterfactual_options(p) -> None:
    """Policies, steps and capture options of a counterfactual run (also used by ``study masking``);
    the run's own options are :class:`~attnprobe.counterfactual.run.RunOptions` fields."""
    from attnprobe.counterfactual.job import StepChoice
    from attnprobe.counterfactual.run import RunOptions
    from attnprobe.counterfactual.study import CounterfactualOptions

    g = p.add_argument_group("counterfactual")
    add_options(g, StepChoice, ("policies", "min_past", "turns", "max_steps", "include_actions"))
    add_options(g, RunOptions, ("actions", "max_new_tokens", "logprob"))
    add_options(g, CounterfactualOptions, ("batch_size",))
    add_hidden_alias(p, "--batch-size", "batch_size", new="--trajectories-per-call", type=positive_int)
    add_capture_options(p, only=("layers", "rendering", "max_tokens", "share_prefixes"))


def run_options(args, progress: bool = True):
    """The counterfactual group's values (:class:`~attnprobe.counterfactual.run.RunOptions`)."""
    from attnprobe.counterfactual.run import RunOptions

    return from_args(RunOptions, args, progress=progress and not args.no_progress)


def model_record(args) -> dict:
    """The model options as the settings record compares them (the weights are compared per step)."""
    return {"spec": getattr(args, "model", None), "backend": getattr(args, "backend", None),
            "dtype": getattr(args, "dtype", None)}


def step_choice(args):
    """The policy and step options (:class:`~attnprobe.counterfactual.job.StepChoice`)."""
    from attnprobe.agents.policy_specs import DEFAULT_MASK_POLICY
    from attnprobe.counterfactual.job import StepChoice

    return StepChoice(tuple(args.policies or [DEFAULT_MASK_POLICY]), args.min_past, args.include_actions, args.turns,
                      args.max_steps)


def counterfactual_options(args, files: list[Path], out: Path):
    """The stage's options record (:class:`~attnprobe.counterfactual.study.CounterfactualOptions`)."""
    from attnprobe.counterfactual.study import CounterfactualOptions

    return CounterfactualOptions(out, files, choice=step_choice(args), run=run_options(args),
                                 batch_size=args.batch_size, force=args.force, model=model_record(args),
                                 table=not getattr(args, "quiet", False))


def cmd_counterfactual(args) -> int:
    """Plan, run resumably on the executor the options choose; the stage writes OUT/summary.json and
    OUT/summary.md and the decision table goes to stdout."""
    from attnprobe.cli.adapter import run_command
    from attnprobe.counterfactual.study import COUNTERFACTUAL

    return run_command(COUNTERFACTUAL, counterfactual_options(args, [Path(p) for p in args.trajectories],
                                                              Path(args.out)), args)


def register(sub) -> None:
    p = sub.add_parser(
        "counterfactual", help="what masking / IRCoT / refinement do to attention and the next action, per step",
        description="For every chosen step of every trajectory, apply each context policy to the messages before "
                    "the step, capture the original and the counterfactual context at the decision position and "
                    "at the step's reasoning start, and record the attention mass the removed spans held, where it "
                    "goes, tokens saved and (--actions) whether the next action changes. One folder per "
                    "(trajectory, policy, step) under OUT; finished steps are skipped on rerun (resume). "
                    "Writes OUT/summary.json and OUT/summary.md.")
    add_options(p, TrajectoryFiles)
    add_model_options(p, backends=True)
    add_counterfactual_options(p)
    add_cluster_options(p)
    add_output_options(p, out_required=True, out_help="output folder")
    p.set_defaults(func=cmd_counterfactual)
