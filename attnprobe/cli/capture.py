"""``attnprobe capture`` and ``attnprobe demo``: capture attention for trajectory files (resumable)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from attnprobe.cli.options import add_capture_options, add_model_options, add_output_options, load_for_capture
from attnprobe.errors import AttnprobeError

log = logging.getLogger(__name__)


def _settings(args) -> dict:
    return {"model": args.model, "backend": args.backend, "dtype": args.dtype, "queries": args.queries,
            "layers": args.layers, "chunk_size": args.chunk_size, "rendering": args.rendering,
            "save_qk_layers": args.save_qk_layers or []}


def run_capture_files(args, files: list[Path], out: Path) -> int:
    """Capture every trajectory of every file into out/<safe id>/; skip finished ones (resume)."""
    from attnprobe.capture.api import capture
    from attnprobe.io import run_resumable, safe_name
    from attnprobe.results.result import META_FILE
    from attnprobe.trajectory.schema import load_trajectories

    trajs = []
    for f in files:
        trajs.extend(load_trajectories(f))  # validate everything before the slow part
    if not trajs:
        raise AttnprobeError("no trajectories in the given files")
    settings = _settings(args)
    wanted = json.loads(json.dumps(settings))

    def done(t) -> bool:
        meta = out / safe_name(t.id) / META_FILE
        return (not args.force and meta.is_file()
                and json.loads(meta.read_text(encoding="utf-8")).get("cli_settings") == wanted)

    # Load the model up front (only if something is left to do): a missing model is exit code 3 for the
    # whole command, not a per-trajectory failure.
    loaded = [load_for_capture(args)] if not all(done(t) for t in trajs) else []

    def work(batch) -> None:
        for t in batch:
            res = capture(loaded[0], t, queries=args.queries, layers=args.layers, chunk_size=args.chunk_size,
                          rendering=args.rendering, max_tokens=args.max_tokens, truncate=args.truncate,
                          save_qk_layers=args.save_qk_layers or (), progress=not args.no_progress)
            res.meta["cli_settings"] = settings
            res.save(out / safe_name(t.id))

    counts = run_resumable(trajs, work, done=done, describe=lambda t: {"trajectory_id": t.id},
                           errors_path=out / "errors.jsonl", stage="capture", desc="capture", unit="traj",
                           progress=not args.no_progress, catch=(AttnprobeError,))
    if counts["done_before"]:
        log.info("resuming: %d of %d trajectories already captured in %s", counts["done_before"], len(trajs), out)
    log.info("captured %d trajectories into %s%s", counts["done"], out,
             f"; {counts['failed']} failed (see {out / 'errors.jsonl'})" if counts["failed"] else "")
    return 1 if counts["failed"] else 0


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
    p.add_argument("trajectories", nargs="+", help="JSONL trajectory files")
    add_model_options(p, backends=True)
    add_capture_options(p)
    add_output_options(p, out_required=True, out_help="output folder (one subfolder per trajectory)")
    p.set_defaults(func=cmd_capture)

    p = sub.add_parser("demo", help="capture + report on the shipped sample trajectories with the bundled model",
                       description="The main job on the embedded default: captures the sample trajectories in "
                                   "trajectories/ with SmolLM2-135M-Instruct (or --model) into OUT and writes "
                                   "OUT/report.html. Takes the same model and capture options as 'capture'.")
    add_model_options(p, backends=True)
    add_capture_options(p)
    add_output_options(p, out_default="runs/demo", out_help="output folder (default runs/demo)")
    p.set_defaults(func=cmd_demo)
