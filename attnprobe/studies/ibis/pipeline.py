"""The IBIS stages as one pipeline: options (:class:`IbisOptions`) -> the model folder (:func:`target`) ->
behaviour (:func:`stage_run`), capture (:func:`stage_capture`), both item group by item group
(:func:`run_all`), aggregate. ``attnprobe ibis`` only parses, opens the executors and prints; each stage
returns its :class:`~attnprobe.execution.counts.RunCounts` and writes its ``run.json`` entry."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from attnprobe.execution.counts import RunCounts
from attnprobe.io.options import non_negative_int, option, positive_int
from attnprobe.studies.ibis.behaviour import DEFAULT_MAX_NEW_TOKENS, DEFAULT_NO_CALL_TOKENS
from attnprobe.studies.ibis.framings import FRAMINGS, PROTOCOLS, REMINDERS, IbisProtocol

DEFAULT_ITEMS_NAME = "ibis_items.jsonl"
DEFAULT_RESULTS = Path("results") / "ibis"
PROTOCOL_HELP = ("paper (default): seed 001 appendix E's layouts, the query never shown to the observer; matched: "
                 "the observer and direct framings also show the query, for attention to the same query tokens "
                 "(docs/methods.md). A model folder holds one protocol.")


@dataclass(frozen=True)
class IbisOptions:
    """What the IBIS commands take (a command without a stage's options keeps their defaults), each option
    declared once here (:func:`attnprobe.io.options.option`; ``attnprobe ibis`` builds its parser from
    them). The defaults are the command's documented ones, so ``IbisOptions()`` runs what ``attnprobe ibis
    all`` runs. ``generator``: ``transformers`` (in process or Ray replicas) or ``openai`` (an endpoint)."""

    items: Path | None = option(None, flag="--items", type=Path,
                                help=f"IBIS items (JSON Lines; default: the shipped set {DEFAULT_ITEMS_NAME})")
    ids: Sequence[str] | None = option(None, flag="--ids", nargs="+", help="use only these item ids")
    limit: int | None = option(None, flag="--limit", type=positive_int, help="use only the first N items")
    results: Path = option(DEFAULT_RESULTS, flag="--results", type=Path,
                           help="results root; each model gets <results>/<model name>/ (default: results/ibis)")
    folder: Path | None = option(None, flag="--folder", type=Path,
                                 help="the model folder itself (overrides --results and the name derived from the "
                                      "model)")
    generator: str = "transformers"
    base_url: str | None = None
    served_model: str | None = None
    model: str = "default"
    dtype: str = "float32"
    protocol: str = option("paper", flag="--protocol", choices=PROTOCOLS, help=PROTOCOL_HELP)
    reminder: str | None = option(
        None, flag="--reminder", choices=REMINDERS,
        help="listing: each framing's reminder exactly as seed 001 appendix E prints it (the paper protocol's "
             "default); identical: one reminder in every framing, as the appendix prose says (the matched "
             "protocol's default). Recorded in run.json and the report")
    framings: Sequence[str] = option(FRAMINGS, flag="--framings", nargs="+", choices=FRAMINGS,
                                     help="framings to run (default: all of them)")
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS  # --max-new-tokens: the generation group's (cli/options.py)
    batch_size: int = option(
        12, flag="--prompts-per-batch", type=positive_int, metavar="N",
        help="prompts generated together (transformers; left-padded batch, same greedy output; default {default})")
    no_call_tokens: int | None = option(
        DEFAULT_NO_CALL_TOKENS, flag="--no-call-tokens", type=non_negative_int,
        help="in process: stop a reply after this many tokens without a tool call opening (default {default}; "
             "0 = never), so one reply never holds its batch for the whole token limit; recorded and compared on "
             "resume")
    chunk_size: int | None = None
    share_prefixes: bool = True
    force: bool = False

    @property
    def ibis_protocol(self) -> IbisProtocol:
        """``--protocol`` and ``--reminder`` as the one value every stage, job and framing takes."""
        return IbisProtocol(self.protocol, self.reminder)

    @property
    def items_path(self) -> Path:
        if self.items is not None:
            return self.items
        from attnprobe.resources import data_path

        return data_path(DEFAULT_ITEMS_NAME)


@dataclass(frozen=True)
class Target:
    """Where an IBIS command writes (the model folder) and the model it names."""

    name: str
    folder: Path

    @property
    def layout(self):
        from attnprobe.studies.ibis.layout import ModelFolderLayout

        return ModelFolderLayout(self.folder)


def select_items(opts: IbisOptions) -> list:
    """The items the options select (``items``, ``ids``, ``limit``)."""
    from attnprobe.studies.ibis.items import ItemError, load_items

    items = load_items(opts.items_path)
    if opts.ids:
        known = {it.id for it in items}
        bad = [i for i in opts.ids if i not in known]
        if bad:
            raise ItemError(f"unknown item ids: {', '.join(bad)}", path=str(opts.items_path), field="id")
        items = [it for it in items if it.id in set(opts.ids)]
    if opts.limit is not None:
        items = items[: opts.limit]
    return items


def target(opts: IbisOptions) -> Target:
    from attnprobe.studies.ibis.folder import model_folder, model_name

    if opts.generator == "openai" and not (opts.served_model and opts.base_url):
        raise ValueError("--generator openai needs --base-url and --served-model")
    name = model_name(opts.model, served_model=opts.served_model if opts.generator == "openai" else None)
    folder = opts.folder or model_folder(opts.results, name, dtype=opts.dtype, protocol=opts.protocol)
    return Target(name, folder)


def prepare(opts: IbisOptions, target: Target, items, generator: str) -> None:
    from attnprobe.studies.ibis.folder import prepare_folder, variant

    endpoint = generator == "openai"
    v = variant(dtype=opts.dtype, model=opts.model, endpoint=opts.base_url if endpoint else None,
                served_model=opts.served_model if endpoint else None)
    prepare_folder(target.folder, items, name=target.name, protocol=opts.ibis_protocol, this_variant=v,
                   items_source=str(opts.items_path))


def stage_run(opts: IbisOptions, target: Target, items, ex) -> RunCounts:
    """Behaviour: one decision per (item, framing) into the folder's decisions on executor ``ex``."""
    return drive(behaviour_steps(opts, target, items, ex), ex)


def stage_capture(opts: IbisOptions, target: Target, items, ex, *, aggregate_now: bool = True) -> RunCounts:
    """Attention at the decision token of every (item, framing) on executor ``ex``; then (``aggregate_now``)
    the folder's aggregate."""
    return drive(capture_steps(opts, target, items, ex, aggregate_now=aggregate_now), ex)


def drive(steps, ex):
    """Run a stage's steps (a generator that yields its job and is sent the executor's counts) on ``ex``, as
    :func:`attnprobe.execution.study.run_study` does; the stage's value."""
    try:
        job = next(steps)
        while True:
            job = steps.send(ex.run(job))
    except StopIteration as end:
        return end.value


def behaviour_steps(opts: IbisOptions, target: Target, items, ex):
    """:func:`stage_run` as steps: yields the behaviour job, is sent its counts, records the stage in run.json;
    returns its :class:`RunCounts`. ``ex``: where the invariants are checked (the generation executor)."""
    from attnprobe.studies.ibis.folder import invariants, update_run
    from attnprobe.studies.ibis.jobs import BehaviourJob

    prepare(opts, target, items, opts.generator)
    # built before the model loads: it refuses a resume with other generation settings
    job = BehaviourJob(target.folder, items, framings=opts.framings, max_new_tokens=opts.max_new_tokens,
                       protocol=opts.ibis_protocol, batch_size=opts.batch_size, force=opts.force,
                       no_call_tokens=(opts.no_call_tokens or None) if opts.generator != "openai" else None)
    inv = ex.call(invariants, items, opts.ibis_protocol)
    counts = yield job
    counts = {"done_before": counts["done_before"], "decided": counts["done"], "failed": counts["failed"]}
    update_run(target.folder, "behaviour", {"backend": opts.generator, "base_url": opts.base_url,
                                            "model_spec": opts.model, "max_new_tokens": opts.max_new_tokens,
                                            "reminder": opts.ibis_protocol.reminder,
                                            "no_call_tokens": job.no_call_tokens,
                                            "decoding": "greedy", "batch_size": opts.batch_size,
                                            "framings": opts.framings, "invariants": inv, **counts})
    return RunCounts(counts["done_before"], counts["decided"], counts["failed"])


def capture_steps(opts: IbisOptions, target: Target, items, ex, *, aggregate_now: bool = True):
    """:func:`stage_capture` as steps: yields the attention job, is sent its counts; returns its
    :class:`RunCounts`. ``ex``: where the invariants are checked (the capture executor)."""
    from attnprobe.io.settings import check_settings, finished_something, record_settings
    from attnprobe.studies.ibis.attention import aggregate
    from attnprobe.studies.ibis.folder import invariants, update_run
    from attnprobe.studies.ibis.jobs import AttentionJob

    if not target.layout.items.is_file():
        prepare(opts, target, items, "transformers")
    force = opts.force
    # finished captures are skipped whatever made them: other capture options are refused (before the model loads)
    wanted = {"model": opts.model, "dtype": opts.dtype, **opts.ibis_protocol.record(),
              # a chunk changes scores only by float rounding: an automatic one (None) resumes any folder
              **({"chunk_size": opts.chunk_size} if opts.chunk_size else {})}
    check_settings(target.folder, "ibis capture", wanted, force=force)
    inv = ex.call(invariants, items, opts.ibis_protocol)
    job = AttentionJob(target.folder, items, framings=FRAMINGS, chunk_size=opts.chunk_size,
                       protocol=opts.ibis_protocol, force=force, share_prefixes=opts.share_prefixes)
    counts = yield job
    if finished_something(counts):  # recorded only once a capture is finished
        record_settings(target.folder, "ibis capture", wanted, force=force)
    counts = {"done_before": counts["done_before"], "captured": counts["done"], "failed": counts["failed"]}
    index = aggregate(items, target.folder, protocol=opts.ibis_protocol) if aggregate_now else None
    used = index["chunk_size"] if index else _chunk_used(target, items, opts.chunk_size)
    update_run(target.folder, "attention", {"model_spec": opts.model, "chunk_size": used,
                                            "invariants": inv, **counts,
                                            "aggregated_items": len(index["items"]) if index else None})
    return RunCounts(counts["done_before"], counts["captured"], counts["failed"])


def _chunk_used(target: Target, items, given: int | None) -> int | None:
    """The chunk the folder's captures ran with (their meta.json: chosen for the device unless given)."""
    from attnprobe.errors import AttnprobeError
    from attnprobe.io import load_json
    from attnprobe.results.result import META_FILE

    for it in items:
        for fr in FRAMINGS:
            meta = target.layout.capture(it.id, fr) / META_FILE
            if meta.is_file():
                try:
                    return load_json(meta).get("chunk_size", given)
                except (AttnprobeError, AttributeError):
                    return given
    return given


def run_all(opts: IbisOptions, target: Target, items, gen, cap, *,
            say: Callable[[str], None] = lambda line: None) -> int:
    """Behaviour and capture item group by item group (so an interrupted run has both for every finished
    item), then aggregate, on the generation executor ``gen`` and the capture executor ``cap``: the exit code."""
    steps = all_steps(opts, target, items, gen, cap, say=say)
    try:
        job = next(steps)
        while True:
            job = steps.send((gen if job.needs == "chat" else cap).run(job))
    except StopIteration as end:
        return end.value


def all_steps(opts: IbisOptions, target: Target, items, gen, cap, *, say: Callable[[str], None] = lambda line: None):
    """:func:`run_all` as steps (each behaviour job needs a chat: the generation executor runs it; each capture
    job the model). A group is what one generation batch holds; an executor that shards (Ray) gets the whole
    set. ``say``: each stage's count line and the progress line; returns the exit code."""
    from attnprobe.studies.ibis.attention import aggregate
    from attnprobe.studies.ibis.folder import update_run

    rc = 0
    per = len(items) if getattr(gen, "shards", False) or getattr(cap, "shards", False) else \
        max(1, opts.batch_size // max(1, len(opts.framings)))
    for start in range(0, len(items), per):
        group = items[start:start + per]
        done = yield from behaviour_steps(opts, target, group, gen)
        say(run_line(done, target))
        captured = yield from capture_steps(opts, target, group, cap, aggregate_now=False)
        say(capture_line(captured, target))
        rc = max(rc, done.exit_code, captured.exit_code)
        say(f"ibis all: {min(start + per, len(items))}/{len(items)} items done")
    index = aggregate(items, target.folder, protocol=opts.ibis_protocol)
    update_run(target.folder, "aggregate", {"items": len(index["items"]) if index else 0})
    return rc


def run_line(counts: RunCounts, target: Target) -> str:
    return counts.line("ibis run", done="decided", to=target.layout.decisions)


def capture_line(counts: RunCounts, target: Target) -> str:
    return counts.line("ibis capture", done="captured", to=target.layout.attention_arrays)
