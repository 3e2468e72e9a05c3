"""``attnprobe study masking``: seed 002's attention evidence and masking counterfactuals in one folder.

For a set of trajectories: capture every reasoning step (``OUT/captures``), compute the headline
shares and decay curves (:mod:`attnprobe.results.analysis`, the seed-002 convention), run the
masking counterfactuals (``OUT/counterfactual``, default ``mask:5``), and write ``OUT/study.json``
and ``OUT/study.md`` with the seed's numbers beside the measured ones. On CPU it runs on the shipped
samples; on a GPU box it is what one runs on BrowseComp-Plus-style trajectories (import the
observation-masking release with ``attnprobe import --format masking``).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from attnprobe.cli.counterfactual import add_counterfactual_options
from attnprobe.cli.options import add_model_options, add_output_options

log = logging.getLogger(__name__)

# Seed 002, section 5.3.1: (label, headline key, the seed's value)
SEED002 = (
    ("past reasoning share of per-step attention", "past_reasoning_share", 0.537),
    ("past observation share of per-step attention", "past_observation_share", 0.256),
    ("observation attention within the newest 10% of past turns", "recent10_observation_share", 0.65),
    ("observation attention by the midpoint (newest half)", "midpoint_observation_share", 0.80),
    ("reasoning attention by the midpoint (newest half)", "midpoint_reasoning_share", 0.68),
)


def study_markdown(head: dict, summary: dict) -> str:
    """The study's tables: seed 002's numbers beside ours, then the counterfactual summary."""
    from attnprobe.counterfactual.summary import markdown_table

    def pct(v):
        return "n/a" if v is None or v != v else f"{100 * v:.1f}%"

    lines = ["# Seed 002 masking study", "",
             f"Steps: {head.get('steps', 0)} reasoning steps with >= {head.get('min_past', 5)} past turns.", "",
             "| measure | seed 002 | measured |", "|---|---|---|"]
    lines += [f"| {label} | {pct(seed)} | {pct(head.get(key))} |" for label, key, seed in SEED002]
    lines += ["", "## Counterfactuals (decision position)", "", markdown_table(summary, "decision"),
              "## Counterfactuals (reasoning start)", "", markdown_table(summary, "reasoning")]
    return "\n".join(lines)


def cmd_study_masking(args) -> int:
    from attnprobe.cli.capture import run_capture_files
    from attnprobe.cli.counterfactual import execute, plan
    from attnprobe.io import atomic_write_text, finite_json
    from attnprobe.results.analysis import decay_curves, headline
    from attnprobe.results.report import find_results
    from attnprobe.results.result import CaptureResult

    out = Path(args.out)
    files = [Path(p) for p in args.trajectories]
    args.policies = args.policies or ["mask:5"]
    plan(args, files)  # bad policies, no qualifying step, bad trajectories: refused now, not after the capture stage
    for k, v in {"queries": "reasoning", "save_qk_layers": [], "truncate": False}.items():
        setattr(args, k, v)
    code = run_capture_files(args, files, out / "captures")
    results = [CaptureResult.load(p) for p in find_results(out / "captures")]
    head = headline(results)
    curves = decay_curves(results)
    code2, summary = execute(args, files, out / "counterfactual")
    study = {"headline": head, "seed002": {key: seed for _, key, seed in SEED002},
             "decay": {k: (v.tolist() if hasattr(v, "tolist") else
                           {r: x.tolist() for r, x in v.items()} if isinstance(v, dict) else v)
                       for k, v in curves.items()},
             "counterfactual": summary}
    atomic_write_text(out / "study.json", json.dumps(finite_json(study), indent=1, default=float))
    md = study_markdown(head, summary)
    atomic_write_text(out / "study.md", md)
    print(md)
    return max(code, code2)


def register(sub) -> None:
    p = sub.add_parser("study", help="ready-made studies (masking: seed 002 after the fact; interference: seeds 002/004 in the loop)",
                       description="Ready-made studies. 'masking': seed 002's attention evidence (headline shares, "
                                   "decay curves) and observation-masking counterfactuals in one folder.")
    studies = p.add_subparsers(dest="study", required=True)
    m = studies.add_parser("masking", help="seed 002: headline shares, decay curves and masking counterfactuals",
                           description=__doc__)
    m.add_argument("trajectories", nargs="+", help="JSONL trajectory files")
    add_model_options(m, backends=True)
    add_counterfactual_options(m)
    add_output_options(m, out_required=True, out_help="study folder (captures/, counterfactual/, study.md)")
    m.set_defaults(func=cmd_study_masking)
    from attnprobe.cli.loop import register as register_interference

    register_interference(studies)
