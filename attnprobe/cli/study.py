"""``attnprobe study masking``: seed 002's attention evidence and masking counterfactuals in one folder.

For a set of trajectories: capture every reasoning step (``OUT/captures``), compute the headline
shares and decay curves (:mod:`attnprobe.results.analysis`, the seed-002 convention), run the
masking counterfactuals (``OUT/counterfactual``, default ``mask:5``), and write ``OUT/study.json``
and ``OUT/study.md`` with the seed's numbers beside the measured ones. On CPU it runs on the shipped
samples; on a GPU box it is what one runs on BrowseComp-Plus-style trajectories (import the
observation-masking release with ``attnprobe import --format masking``).
"""

from __future__ import annotations

import logging
from pathlib import Path

from attnprobe.cli.counterfactual import add_counterfactual_options
from attnprobe.cli.options import TrajectoryFiles, add_model_options, add_options, add_output_options

log = logging.getLogger(__name__)


def masking_options(args):
    """The study's options record (:class:`~attnprobe.studies.masking.MaskingOptions`) from the parsed ones."""
    from attnprobe.capture.job import CaptureOptions
    from attnprobe.cli.counterfactual import model_record, run_options, step_choice
    from attnprobe.cli.options import model_options
    from attnprobe.studies.masking import MaskingOptions

    capture = CaptureOptions(layers=args.layers, chunk_size=args.chunk_size, rendering=args.rendering,
                             max_tokens=args.max_tokens, share_prefixes=args.share_prefixes)
    return MaskingOptions([Path(p) for p in args.trajectories], Path(args.out), model_options(args),
                          capture=capture, choice=step_choice(args), counterfactual=run_options(args),
                          model_record=model_record(args), batch_size=args.batch_size, force=args.force,
                          progress=not args.no_progress, quiet=getattr(args, "quiet", False))


def cmd_study_masking(args) -> int:
    from attnprobe.cli.adapter import run_command
    from attnprobe.studies.masking import MASKING

    return run_command(MASKING, masking_options(args), args)


def register(sub) -> None:
    p = sub.add_parser("study", help="ready-made studies (masking: seed 002 after the fact; interference: seeds 002/004 in the loop)",
                       description="Ready-made studies. 'masking': seed 002's attention evidence (headline shares, "
                                   "decay curves) and observation-masking counterfactuals in one folder.")
    studies = p.add_subparsers(dest="study", required=True)
    m = studies.add_parser("masking", help="seed 002: headline shares, decay curves and masking counterfactuals",
                           description=__doc__)
    add_options(m, TrajectoryFiles)
    add_model_options(m, backends=True)
    add_counterfactual_options(m)
    from attnprobe.studies.masking import layout as L

    add_output_options(m, out_required=True,
                       out_help=f"study folder ({L.CAPTURES}/, {L.COUNTERFACTUAL}/, {L.STUDY_MD})")
    m.set_defaults(func=cmd_study_masking)
    from attnprobe.cli.loop import register as register_interference

    register_interference(studies)
