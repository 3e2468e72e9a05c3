"""``attnprobe capture`` and ``attnprobe demo``: capture attention for trajectory files (resumable)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from attnprobe.cli.options import (
    add_capture_options,
    add_model_options,
    add_output_options,
    capture_load_options,
    load_for_capture,
)
from attnprobe.distributed import add_cluster_options, cluster_from_args
from attnprobe.errors import AttnprobeError

log = logging.getLogger(__name__)


def _settings(args) -> dict:
    return {"model": args.model, "backend": args.backend, "dtype": args.dtype, "queries": args.queries,
            "layers": args.layers, "chunk_size": args.chunk_size, "rendering": args.rendering,
            "save_qk_layers": args.save_qk_layers or [], "max_tokens": args.max_tokens, "truncate": args.truncate}


def _resume_state(folder: Path, traj, wanted: dict, weights: str | None) -> tuple[bool, str | None]:
    """(already done, conflict) for one trajectory's output folder.

    Done means: a readable meta.json made with the same settings and weights from a trajectory with
    the same content hash. A corrupt meta.json (named in a warning) or a changed trajectory (one info
    line) means recapture. Other settings or weights are a conflict: the caller refuses to mix them.
    """
    from attnprobe.io import load_json
    from attnprobe.results.result import META_FILE

    meta_path = folder / META_FILE
    if not meta_path.exists():
        return False, None
    try:
        meta = load_json(meta_path)
        if not isinstance(meta, dict):
            raise AttnprobeError(f"{meta_path}: expected a JSON object, got {type(meta).__name__}")
    except AttnprobeError as exc:
        log.warning("unreadable capture metadata, recapturing %r: %s", traj.id, exc)
        return False, None
    recorded = meta.get("cli_settings")
    if not isinstance(recorded, dict):
        log.warning("%s records no capture settings (not written by 'attnprobe capture'); recapturing %r",
                    meta_path, traj.id)
        return False, None
    diffs = [f"{k} was {recorded[k]!r}, now {wanted[k]!r}" for k in wanted if k in recorded and recorded[k] != wanted[k]]
    if weights and meta.get("weights_hash") and meta["weights_hash"] != weights:
        diffs.append(f"weights fingerprint was {meta['weights_hash']}, now {weights} (the model files changed)")
    if diffs:
        return False, f"{meta_path}: {'; '.join(diffs)}"
    now = traj.content_hash()
    if meta.get("trajectory_hash") is None:
        log.info("%s records no trajectory content hash (an older attnprobe); recapturing %r", meta_path, traj.id)
        return False, None
    if meta["trajectory_hash"] != now:
        log.info("trajectory %r changed since it was captured (content hash %s -> %s); recapturing",
                 traj.id, meta["trajectory_hash"], now)
        return False, None
    return True, None


def run_capture_files(args, files: list[Path], out: Path) -> int:
    """Capture every trajectory of every file into out/<safe id>/; skip finished ones (resume).

    Before any model is loaded: all inputs are validated (ids unique across files), the output
    folder is proven writable and cleaned of work folders an interrupted run left, and every
    existing result is checked against this run's settings and weights (a mismatch is refused
    unless --force, so variants are never mixed in one folder).
    """
    from attnprobe.capture.api import capture, weights_hash
    from attnprobe.io import ensure_writable_dir, recover_atomic_dirs, run_resumable, safe_name
    from attnprobe.trajectory.schema import check_unique_ids, load_trajectories

    trajs = []
    for f in files:
        trajs.extend(load_trajectories(f))  # validate everything before the slow part
    if not trajs:
        raise AttnprobeError("no trajectories in the given files")
    check_unique_ids(trajs)
    ensure_writable_dir(out)
    recover_atomic_dirs(out)
    settings = _settings(args)
    wanted = json.loads(json.dumps(settings))
    states: dict[str, bool] = {}
    conflicts: list[str] = []
    if not args.force:
        weights = weights_hash(args.model)
        for t in trajs:
            states[t.id], conflict = _resume_state(out / safe_name(t.id), t, wanted, weights)
            if conflict:
                conflicts.append(conflict)
    if conflicts:
        more = f" (and {len(conflicts) - 1} more)" if len(conflicts) > 1 else ""
        raise AttnprobeError(f"{out} holds captures made with other settings: {conflicts[0]}{more}; "
                             "use another --out, or --force to replace them")

    def done(t) -> bool:
        return states.get(t.id, False)

    cluster = cluster_from_args(args)
    if cluster is not None:  # Ray replicas write the same folders, atomically (docs/scale.md)
        from attnprobe.distributed import capture_distributed

        counts = capture_distributed(
            args.model, trajs, out, cluster=cluster, backend=args.backend, dtype=args.dtype,
            load_options=capture_load_options(args), chunk_size=args.chunk_size, queries=args.queries,
            layers=args.layers, rendering=args.rendering, max_tokens=args.max_tokens, truncate=args.truncate,
            save_qk_layers=args.save_qk_layers or (), extra_meta={"cli_settings": settings}, done=done,
            force=args.force, catch=(AttnprobeError,), progress=not args.no_progress)
    else:
        # Load the model up front (only if something is left to do): a missing model is exit code 3 for
        # the whole command, not a per-trajectory failure.
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
