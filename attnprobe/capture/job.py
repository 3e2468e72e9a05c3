"""``attnprobe capture`` as a job: one work item per trajectory, one result folder each.

Done means a readable meta.json made with the same settings and weights from a trajectory with the
same content hash. A corrupt meta.json (named in a warning) or a changed trajectory (one info line)
means recapture. Other settings or weights are a *conflict*: :meth:`CaptureJob.conflicts` lists them
before any model loads, and the command refuses to mix variants in one folder unless ``--force``.

Trajectories that begin alike (same tools, same first two messages: the calls of one recorded agent
run, which extend each other) form a group of up to :data:`GROUP_LIMIT`, captured in one backend call
that prefills their common prefixes once (:func:`sharing_groups`); the rest are captured one by one.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnprobe.capture.api import capture_many, weights_hash
from attnprobe.errors import AttnprobeError
from attnprobe.execution.job import JobBase, WorkItem, written_since
from attnprobe.io import load_json, recover_atomic_dirs, safetensors_problem
from attnprobe.io.options import option, parse_int_list, parse_layers, parse_queries, positive_int
from attnprobe.results.layout import CaptureLayout
from attnprobe.results.result import META_FILE, QK_FILE, SCORES_FILE
from attnprobe.trajectory.schema import Trajectory
from attnprobe_hooks.backend import DEFAULT_CHUNK_SIZE

log = logging.getLogger(__name__)

# Trajectories per sharing group: one backend call, written when it ends (the resume granularity).
GROUP_LIMIT = 32


def sharing_groups(trajectories: Sequence[Trajectory]) -> list[tuple[Trajectory, str | None]]:
    """The trajectories in capture order with their group (None: alone). A family is the trajectories
    with the same tools and first two messages (system and task, or the task and the first reply),
    in first-appearance order; inside it they are sorted by their messages, so a call comes right
    before the calls that extend it, and cut into groups of up to :data:`GROUP_LIMIT`."""
    def dump(x) -> str:
        return json.dumps(x, sort_keys=True, default=str)

    families: dict[str, list[Trajectory]] = {}
    for t in trajectories:
        key = hashlib.sha1(dump([t.tools, t.messages[:2]]).encode()).hexdigest()[:16]
        families.setdefault(key, []).append(t)
    out: list[tuple[Trajectory, str | None]] = []
    for key, ts in families.items():
        if len(ts) == 1:
            out.append((ts[0], None))
            continue
        ts = sorted(ts, key=lambda t: [dump(m) for m in t.messages])
        for k in range(0, len(ts), GROUP_LIMIT):
            part = ts[k:k + GROUP_LIMIT]
            out += [(t, f"{key}/{k // GROUP_LIMIT}" if len(part) > 1 else None) for t in part]
    return out


RENDERINGS = ("auto", "native", "native+reasoning-in-content", "text")


@dataclass(frozen=True)
class CaptureOptions:
    """What a capture is made with (besides the model); recorded in every meta.json as ``cli_settings``
    together with the model, backend and dtype, and compared on resume. Each field is also the
    command-line option of the "capture" group (``attnprobe.cli.options.add_capture_options``): one
    declaration, one default."""

    queries: str | list[int] = option(
        "reasoning", flag="--queries", type=parse_queries,
        help="reasoning | decision | reasoning+decision | positions:10,20,300 (default {default})")
    layers: list[int] | str | None = option(  # "full": the full-attention layers (seed 002 E.1)
        None, flag="--layers", type=parse_layers,
        help="layers to score: e.g. '0-3,10', 'full' (the full-attention layers of a hybrid model, "
             "seed 002 E.1) or 'all' (default)")
    chunk_size: int | None = option(
        None, flag="--chunk-size", type=positive_int,
        help="prefill chunk size in tokens (default: chosen for the device: one pass on a GPU when the "
             f"trajectory fits its free memory, else the largest chunk that does; {DEFAULT_CHUNK_SIZE} on a CPU; "
             "meta.json records the chunk and why)")
    rendering: str = option("auto", flag="--rendering", choices=RENDERINGS,
                            help="how the trajectory is rendered (default auto: the richest the chat template "
                                 "supports)")
    save_qk_layers: list[int] = option(default_factory=list, flag="--save-qk-layers", type=parse_int_list,
                                       help="also save q/k of these layers")
    max_tokens: int | None = option(None, flag="--max-tokens", type=positive_int,
                                    help="refuse longer trajectories (default: the model's max_position_embeddings)")
    truncate: bool = option(False, flag="--truncate", action="store_true",
                            help="truncate over-long trajectories instead of refusing")
    # trajectories of one backend call share the prefill of common prefixes (exact within 1e-5); the
    # API's capture_many defaults the same way
    share_prefixes: bool = option(
        True, flag="--no-prefix-sharing", action="store_false",
        help="prefill every context from token 0 (default: contexts of one backend call share the prefill of a "
             "common prefix, exactly; on vLLM through its prefix cache; docs/prefix_sharing.md)")


@dataclass
class CaptureJob(JobBase):
    """Capture ``trajectories`` into ``out/<safe id>/`` with ``options``. ``model``/``backend``/``dtype``
    describe the model for the resume check (``weights`` is its fingerprint, computed from ``model``
    when not given); ``progress`` shows per-chunk bars."""

    out: Path
    trajectories: Sequence[Trajectory]
    options: CaptureOptions
    model: str = "default"
    backend: str = "transformers"
    dtype: str = "float32"
    force: bool = False
    progress: bool = False
    weights: str | None = None
    stage: str = "capture"
    unit: str = "traj"
    catch: tuple[type[BaseException], ...] = (AttnprobeError,)

    def __post_init__(self) -> None:
        self.out = Path(self.out)
        if self.weights is None:
            self.weights = weights_hash(self.model)
        self._states: dict[str, tuple[bool, str | None]] = {}
        # tokens of the trajectories this job captured and tokens it prefilled for them (in this process:
        # a Ray replica counts its own)
        self.tally: dict[str, int] = {"plan_tokens": 0, "prefilled_tokens": 0}

    @property
    def settings(self) -> dict:
        """``cli_settings`` of every meta.json this job writes (JSON round-tripped, as read back)."""
        o = self.options
        return json.loads(json.dumps({
            "model": self.model, "backend": self.backend, "dtype": self.dtype, "queries": o.queries,
            "layers": o.layers, "chunk_size": o.chunk_size, "rendering": o.rendering,
            "save_qk_layers": list(o.save_qk_layers or []), "max_tokens": o.max_tokens, "truncate": o.truncate}))

    def folder(self, trajectory: Trajectory) -> Path:
        return CaptureLayout(self.out).folder(trajectory.id)

    def items(self) -> list[WorkItem]:
        cap = self.options.max_tokens if self.options.truncate else None
        return [WorkItem(key=t.id, tokens=t.estimated_tokens(cap), describe={"trajectory_id": t.id}, data=t,
                         group=group if self.options.share_prefixes else None)
                for t, group in sharing_groups(self.trajectories)]

    def _state(self, t: Trajectory, since: float | None = None) -> tuple[bool, str | None]:
        """(done, conflict) of one trajectory's folder; decided once per trajectory (the driver asks for
        conflicts before the model loads, then for what is done), so each reason is logged once."""
        if since is None:
            if t.id not in self._states:
                self._states[t.id] = self._read_state(t, None)
            return self._states[t.id]
        return self._read_state(t, since)

    def _read_state(self, t: Trajectory, since: float | None) -> tuple[bool, str | None]:
        folder = self.folder(t)
        meta_path = folder / META_FILE
        if folder.is_symlink():  # not followed: recaptured, the new folder replaces the link
            log.warning("%s: is a symlink; not followed, recapturing %r", folder, t.id)
            return False, None
        if not written_since(meta_path, since):
            return False, None
        try:
            meta = load_json(meta_path)
            if not isinstance(meta, dict):
                raise AttnprobeError(f"{meta_path}: expected a JSON object, got {type(meta).__name__}")
        except AttnprobeError as exc:
            log.warning("unreadable capture metadata, recapturing %r: %s", t.id, exc)
            return False, None
        recorded = meta.get("cli_settings")
        if not isinstance(recorded, dict):
            log.warning("%s records no capture settings (not written by 'attnprobe capture'); recapturing %r",
                        meta_path, t.id)
            return False, None
        wanted = self.settings
        # an automatic chunk (None) resumes a folder made with any chunk: chunks differ by float rounding only
        diffs = [f"{k} was {recorded[k]!r}, now {wanted[k]!r}" for k in wanted
                 if k in recorded and recorded[k] != wanted[k] and not (k == "chunk_size" and wanted[k] is None)]
        if self.weights and meta.get("weights_hash") and meta["weights_hash"] != self.weights:
            diffs.append(f"weights fingerprint was {meta['weights_hash']}, now {self.weights} (the model files "
                         "changed)")
        if diffs:
            return False, f"{meta_path}: {'; '.join(diffs)}"
        now = t.content_hash()
        if meta.get("trajectory_hash") is None:
            log.info("%s records no trajectory content hash (an older attnprobe); recapturing %r", meta_path, t.id)
            return False, None
        if meta["trajectory_hash"] != now:
            log.info("trajectory %r changed since it was captured (content hash %s -> %s); recapturing",
                     t.id, meta["trajectory_hash"], now)
            return False, None
        for name in (SCORES_FILE, QK_FILE) if self.options.save_qk_layers else (SCORES_FILE,):
            problem = safetensors_problem(folder / name)  # a truncated file is not a finished capture
            if problem:
                log.warning("%s: %s; recapturing %r", folder / name, problem, t.id)
                return False, None
        return True, None

    def conflicts(self) -> list[str]:
        """Result folders made with other settings or weights (checked before any model loads)."""
        return [c for t in self.trajectories if (c := self._state(t)[1])]

    def done(self, item: WorkItem, since: float | None = None) -> bool:
        return self._state(item.data, since)[0]

    def run(self, model: Any, batch: Sequence[WorkItem]) -> list[None]:
        o = self.options
        trajs = [it.data for it in batch]
        results = capture_many(model, trajs, queries=o.queries, layers=o.layers, chunk_size=o.chunk_size,
                               rendering=o.rendering, max_tokens=o.max_tokens, truncate=o.truncate,
                               save_qk_layers=o.save_qk_layers or (), progress=self.progress,
                               share_prefixes=o.share_prefixes and len(trajs) > 1,  # one plan: nothing to share
                               tally=self.tally)
        for t, res in zip(trajs, results):
            res.meta["cli_settings"] = self.settings
            res.save(self.folder(t))
        return [None] * len(batch)

    def finish(self) -> list[str]:
        return recover_atomic_dirs(self.out) if self.out.is_dir() else []


def capture_files(files: Sequence[Path], out: Path, options: CaptureOptions, model, open_executor, *,
                  force: bool = False, progress: bool = True) -> dict[str, int]:
    """Capture every trajectory of ``files`` into ``out/<safe id>/`` (resumable): the one body of
    ``attnprobe capture`` and of the studies that capture. ``model``: the
    :class:`~attnprobe.capture.models.ModelSpec` of the resume check; ``open_executor()``: the executor's
    context manager, entered only after the inputs are read, ``out`` is locked and cleaned and no
    finished capture conflicts (a mismatch is refused unless ``force``). The executor's counts."""
    from attnprobe.io import ensure_writable_dir, hold_dir_lock
    from attnprobe.trajectory.schema import load_files

    trajs = load_files(files)  # validate everything before the slow part
    ensure_writable_dir(out)
    with hold_dir_lock(out):  # one run per output folder: a second is refused, naming the first's PID
        recover_atomic_dirs(out)
        job = CaptureJob(out, trajs, options, model=model.spec, backend=model.backend, dtype=model.dtype,
                         force=force, progress=progress)
        conflicts = [] if force else job.conflicts()
        if conflicts:
            more = f" (and {len(conflicts) - 1} more)" if len(conflicts) > 1 else ""
            raise AttnprobeError(f"{out} holds captures made with other settings: {conflicts[0]}{more}; "
                                 "use --force to redo or another --out")
        # The model loads only if something is left to do; a missing model is exit code 3 for the whole
        # command, not a per-trajectory failure (it is not in the job's catch).
        with open_executor() as ex:
            counts = ex.run(job)
    if counts["done_before"]:
        log.info("resuming: %d of %d trajectories already captured in %s", counts["done_before"], len(trajs), out)
    log.info("captured %d trajectories into %s%s", counts["done"], out,
             f"; {counts['failed']} failed (see {CaptureLayout(out).errors})" if counts["failed"] else "")
    return counts
