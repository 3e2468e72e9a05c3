"""``attnprobe counterfactual``: per-step context counterfactuals (masking, IRCoT, refinement)."""

from __future__ import annotations

import logging
from pathlib import Path

from attnprobe.cli.options import (
    add_capture_options,
    add_cluster_options,
    add_hidden_alias,
    add_model_options,
    add_options,
    add_output_options,
    from_args,
    non_negative_int,
    parse_int_list,
    positive_int,
)

log = logging.getLogger(__name__)

POLICY_HELP = ("context policy, repeatable: mask:K (seed 002 observation masking as its released scaffold does "
               "it: successful results older than the K-th most recent turn with a non-error call become "
               "'[Auto-archived browser result] tool=... | args: ...'), mask-obs:K (keep the K most recent "
               "observations), ircot:o | ircot:oq "
               "| ircot:oqp (seed 004 section 3.2), refine:bm25[:N] (seed 004 section 3.3: every round's "
               "observation refined with its own query, keep N sentences), refine-latest:bm25[:N] (the latest "
               "observation only), refine:openai:BASE_URL:MODEL; errors are never masked")


def add_counterfactual_options(p) -> None:
    """Policies, steps and capture options of a counterfactual run (also used by ``study masking``);
    the run's own options are :class:`~attnprobe.counterfactual.run.RunOptions` fields."""
    from attnprobe.counterfactual.run import RunOptions

    g = p.add_argument_group("counterfactual")
    g.add_argument("--policy", action="append", dest="policies", metavar="POLICY", help=POLICY_HELP)
    g.add_argument("--min-past", type=non_negative_int, default=None,
                   help="steps with at least this many past turns (default: the first step at which the policy can "
                        "act: K+1 for mask:K and mask-obs:K, 2 for IRCoT, 1 for refiners; the smallest when "
                        "policies are mixed)")
    g.add_argument("--turns", type=parse_int_list, default=None, help="only these step turns, e.g. '5-8,12'")
    g.add_argument("--max-steps", type=positive_int, default=None, help="at most this many steps per trajectory")
    g.add_argument("--include-actions", action="store_true", help="also tool-call-only steps (no reasoning text)")
    add_options(g, RunOptions, ("actions", "max_new_tokens", "logprob"))
    g.add_argument("--trajectories-per-call", dest="batch_size", type=positive_int, default=1, metavar="N",
                   help="trajectories per backend call; the steps of one trajectory always share one call, which "
                        "prefills their common prefixes once (vLLM batches all their contexts in one generate)")
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
    from attnprobe.counterfactual.job import StepChoice

    return StepChoice(tuple(args.policies or StepChoice.policies), args.min_past, args.include_actions, args.turns,
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
    p.add_argument("trajectories", nargs="+", help="JSONL trajectory files")
    add_model_options(p, backends=True)
    add_counterfactual_options(p)
    add_cluster_options(p)
    add_output_options(p, out_required=True, out_help="output folder")
    p.set_defaults(func=cmd_counterfactual)
