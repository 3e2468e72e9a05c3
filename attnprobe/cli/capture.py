"""``attnprobe capture`` and ``attnprobe demo``: capture attention for trajectory files (resumable)."""

from __future__ import annotations

import logging
from pathlib import Path

from attnprobe.cli.options import (
    TrajectoryFiles,
    add_capture_options,
    add_cluster_options,
    add_model_options,
    add_options,
    add_output_options,
    capture_options,
    model_options,
)

log = logging.getLogger(__name__)


def run_capture_files(args, files: list[Path], out: Path) -> int:
    """Capture every trajectory of every file into out/<safe id>/; skip finished ones (resume).

    Before any model is loaded: all inputs are validated (ids unique across files), the output
    folder is proven writable and cleaned of work folders an interrupted run left, and every
    existing result is checked against this run's settings and weights (a mismatch is refused
    unless --force, so variants are never mixed in one folder): :class:`attnprobe.capture.job.CaptureStudy`.
    """
    from attnprobe.capture.job import CAPTURE, CaptureFilesOptions
    from attnprobe.cli.adapter import run_command

    options = CaptureFilesOptions(files, out, capture_options(args), model_options(args), force=args.force,
                                  progress=not args.no_progress)
    return run_command(CAPTURE, options, args)


def cmd_capture(args) -> int:
    return run_capture_files(args, [Path(p) for p in args.trajectories], Path(args.out))


def cmd_demo(args) -> int:
    from attnprobe.resources import SAMPLE_TRAJECTORIES, data_path

    files = [data_path(f) for f in SAMPLE_TRAJECTORIES]
    out = Path(args.out)
    code = run_capture_files(args, files, out)
    from attnprobe.results.report import write_report

    path = write_report(out)
    print(f"demo done: captures in {out}, report at {path}")
    return code


def register(sub) -> None:
    p = sub.add_parser("capture", help="capture attention for trajectories (chunked prefill + online scoring)",
                       description="Render each trajectory with the model's chat template, run one chunked prefill "
                                   "with capture hooks, and save exact attention by segment, turn and role into "
                                   "OUT/<trajectory id>/. Finished trajectories are skipped on rerun (resume; "
                                   "--force redoes them); failures go to OUT/errors.jsonl and give exit code 1.")
    add_options(p, TrajectoryFiles)
    add_model_options(p, backends=True)
    add_capture_options(p)
    add_cluster_options(p)
    add_output_options(p, out_required=True, out_help="output folder (one subfolder per trajectory)")
    p.set_defaults(func=cmd_capture)

    p = sub.add_parser("demo", help="capture + report on the shipped sample trajectories with the bundled model",
                       description="The main job on the embedded default: captures the sample trajectories in "
                                   "trajectories/ with SmolLM2-135M-Instruct (or --model) into OUT and writes "
                                   "OUT/report.html. Takes the same model and capture options as 'capture'.")
    add_model_options(p, backends=True)
    add_capture_options(p)
    add_cluster_options(p)
    add_output_options(p, out_default="runs/demo", out_help="output folder (default runs/demo)")
    p.set_defaults(func=cmd_demo)
