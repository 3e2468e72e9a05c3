"""Capture spread over a Ray cluster: one model replica per Ray actor, shards of work sized by tokens.

Why Ray: vLLM already uses it for multi-node execution, so a cluster that runs vLLM runs this too,
and attnprobe does not grow a scheduler of its own. What stays the same as single-process capture:

- every result is written by the replica that computed it, with :meth:`CaptureResult.save`
  (``AtomicDir``: a folder appears whole or not at all) into the same folder a single-process run
  uses (``OUT/<safe id>/``, IBIS ``FOLDER/captures/<item>/<framing>/``), with the same meta.json,
  so the app and the reports read it unchanged; the output path must be shared by every node;
- "done" is decided on the driver before the job, by the caller's own check (``attnprobe capture``
  passes its settings/weights check; default: meta.json present); a replica skips only what this
  job already wrote (meta.json newer than the job's start), so a retried shard never rewrites what
  an earlier attempt finished;
- per-item failures go to ``errors.jsonl`` (written by the driver only) and are retried next run.

Scheduling: items are grouped into shards of about ``shard_tokens`` estimated tokens (first-fit
decreasing; an item larger than the target is a shard of its own) and handed largest first to
whichever replica is idle, so long trajectories do not pile up on one replica. Tokens are
estimated from the JSON text of the messages (:data:`CHARS_PER_TOKEN`) so the driver needs neither
the model nor its tokenizer. A replica that dies has its shard put back in the queue for the
others (and a replacement is started, up to ``max_replacements``); Ray's own actor restarts and
task retries (``max_restarts``/``max_task_retries``) cover crashes it can restart by itself.

The driver writes ``distributed.json`` into the output folder: one record per job with
per-replica throughput. Nothing here is imported unless ``ray`` is installed (extra ``[ray]``).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import socket
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from attnprobe.errors import AttnprobeError
from attnprobe.io import EXPECTED_ERRORS, atomic_write_text, load_json, log_error, recover_atomic_dirs

log = logging.getLogger(__name__)

RUN_FILE = "distributed.json"
RAY_HINT = "Ray is not installed: pip install 'attnprobe[ray]'"
# Measured on the shipped samples with the SmolLM2 tokenizer: 3.4-3.6 characters of message JSON per
# token. Only the relative sizes matter for balancing, so one constant for every model is enough.
CHARS_PER_TOKEN = 3.5
SHARDS_PER_REPLICA = 4  # default shard size: total tokens / (replicas * this)


# ------------------------------------------------------------------------------------ configuration
@dataclass(frozen=True)
class Cluster:
    """Where and how to run replicas.

    address: None or "local" starts a Ray instance on this machine (or reuses the one this process
    already joined); "auto" joins the cluster this machine belongs to; "host:port" a head node's GCS;
    "ray://host:port" a Ray Client server (needs ``ray[client]``). replicas: how many model replicas
    (default: as many as the cluster's nodes can host, at most one per shard). cpus/gpus_per_replica:
    resources each replica reserves (gpus default: the vLLM tensor-parallel size, 1 for transformers
    on cuda, else 0). tp_across_nodes: vLLM only, one replica's tensor-parallel ranks may sit on
    several nodes (vLLM's Ray executor inside a placement group; untested without GPUs).
    """

    address: str | None = None
    replicas: int | None = None
    cpus_per_replica: float = 1.0
    gpus_per_replica: float | None = None
    tp_across_nodes: bool = False
    num_cpus: int | None = None  # local instance only (default: every core)
    shard_tokens: int | None = None
    max_replacements: int | None = None  # replicas started to replace dead ones (default: replicas)
    torch_threads: int | None = None  # per replica (default: cpus_per_replica, at least 1)
    startup_timeout: float = 1800.0  # seconds to wait for the first replica to load its model
    log_to_driver: bool = False  # replica stdout/stderr on the driver (GGUF conversion bars are noisy)


def _ray():
    try:
        import ray
    except ImportError:
        raise AttnprobeError(RAY_HINT) from None
    return ray


ADDRESS_RE = re.compile(r"^(ray://)?\[?[A-Za-z0-9_.:-]+?\]?:\d{1,5}$")


def check_address(text: str | None) -> str | None:
    """Validate a ``--ray`` address early (a file name swallowed by ``--ray`` must not look valid)."""
    if text in (None, "local", "auto") or ADDRESS_RE.match(text or ""):
        return text
    raise AttnprobeError(f"--ray address {text!r} is not local, auto, host:port or ray://host:port "
                         "(write --ray=ADDRESS, or put --ray after the input files)")


def _reachable(address: str, timeout: float = 5.0) -> None:
    """Fail fast on a host:port that does not answer (ray.init would retry for minutes)."""
    hostport = address.removeprefix("ray://")
    host, _, port = hostport.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            pass
    except OSError as exc:
        raise AttnprobeError(f"cannot reach the Ray cluster at {address}: {exc.strerror or exc} "
                             "(is 'ray start --head' running there, and is the port open?)") from None


def connect(cluster: Cluster) -> bool:
    """Join or start the Ray instance ``cluster`` names; True if this call started it (so it stops it)."""
    ray = _ray()
    if ray.is_initialized():
        return False
    address = check_address(cluster.address)
    kwargs: dict[str, Any] = {"log_to_driver": cluster.log_to_driver}
    if address in (None, "local"):
        kwargs.update(num_cpus=cluster.num_cpus, include_dashboard=False)
    else:
        if address != "auto":
            _reachable(address)
        kwargs["address"] = address
    try:
        ray.init(**kwargs)
    except (ConnectionError, ValueError, RuntimeError) as exc:
        where = "this machine's Ray cluster (address auto)" if address == "auto" else f"the Ray cluster at {address}"
        hint = ""
        if address.startswith("ray://"):  # measured with Ray 2.60: the client sends no token, the server waits
            hint = (" (Ray Client does not pass Ray's token authentication: start that cluster with "
                    "RAY_AUTH_MODE=disabled on a trusted network, or run on one of its nodes with --ray auto)")
        raise AttnprobeError(f"cannot connect to {where}: {str(exc).splitlines()[0]}{hint}") from None
    return True


# ------------------------------------------------------------------------------------ shards
def estimate_tokens(trajectory, max_tokens: int | None = None) -> int:
    """Tokens of a trajectory estimated from its message (and tool) JSON; no tokenizer needed."""
    chars = len(json.dumps(trajectory.messages, ensure_ascii=False))
    if trajectory.tools:
        chars += len(json.dumps(trajectory.tools, ensure_ascii=False))
    est = max(1, round(chars / CHARS_PER_TOKEN))
    return min(est, max_tokens) if max_tokens else est


def make_shards(sizes: Sequence[int], target: int) -> list[list[int]]:
    """Indices grouped into shards of at most ``target`` (first-fit decreasing), largest shard first.

    An item larger than ``target`` is a shard by itself. Within a shard indices keep input order.
    """
    if target < 1:
        raise ValueError("shard target must be >= 1 token")
    bins: list[list[int]] = []
    loads: list[int] = []
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        for b, load in enumerate(loads):
            if load + sizes[i] <= target:
                bins[b].append(i)
                loads[b] += sizes[i]
                break
        else:
            bins.append([i])
            loads.append(sizes[i])
    order = sorted(range(len(bins)), key=lambda b: (-loads[b], min(bins[b])))
    return [sorted(bins[b]) for b in order]


# ------------------------------------------------------------------------------------ done-check
def is_done(out: str | Path, match: dict | None = None) -> bool:
    """The default done-check: meta.json exists (and its keys equal ``match``), as in ``run_attention``.
    Callers with a stricter rule (``attnprobe capture``'s settings/weights check) pass their own."""
    from attnprobe.results.result import META_FILE

    meta_path = Path(out) / META_FILE
    if not meta_path.is_file():
        return False
    if match:
        try:
            meta = load_json(meta_path)
        except AttnprobeError:
            return False
        return isinstance(meta, dict) and all(meta.get(k) == v for k, v in match.items())
    return True


def written_by_job(out: str | Path, job_start: float) -> bool:
    """Whether ``out`` was finished by this job (an earlier attempt of a retried shard): its
    meta.json is newer than the job's start, taken from the same filesystem's clock (:func:`fs_now`)."""
    from attnprobe.results.result import META_FILE

    try:
        return (Path(out) / META_FILE).stat().st_mtime >= job_start
    except FileNotFoundError:
        return False


def fs_now(folder: Path) -> float:
    """The current time by the clock of the filesystem holding ``folder`` (node clocks may differ)."""
    import tempfile

    folder.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=".job-clock.", dir=folder)
    try:
        return os.fstat(fd).st_mtime
    finally:
        os.close(fd)
        os.unlink(name)


# ------------------------------------------------------------------------------------ the replica
class Replica:
    """A Ray actor holding one loaded model; runs shards and writes each result itself."""

    def __init__(self, spec: str, backend: str, dtype: str, load_options: dict, torch_threads: int):
        import torch

        torch.set_num_threads(max(1, int(torch_threads)))
        from attnprobe.capture.models import load_model

        t0 = time.perf_counter()
        self.model, self.load_error = None, None
        try:  # kept, not raised: a failed __init__ reaches the driver only as text, this keeps its type
            self.model = load_model(spec, backend=backend, dtype=dtype, **load_options)
        except Exception as exc:
            self.load_error = exc
        try:
            import ray

            ctx = ray.get_runtime_context()
            node, gpus = ctx.get_node_id(), [str(g) for g in ctx.get_accelerator_ids().get("GPU", [])]
        except Exception:  # outside Ray (unit use): no context
            node, gpus = None, []
        self.info = {"host": socket.gethostname(), "node_id": node, "pid": os.getpid(), "gpus": gpus,
                     "torch_threads": torch.get_num_threads(), "load_seconds": round(time.perf_counter() - t0, 3)}

    def ping(self) -> dict:
        """The replica's description once its model is loaded; raises the load error if it failed."""
        if self.load_error is not None:
            raise self.load_error
        return self.info

    def call(self, fn, *args):
        """``fn(loaded_model, *args)`` here (e.g. a check that needs the tokenizer)."""
        if self.load_error is not None:
            raise self.load_error
        return fn(self.model, *args)

    def run(self, items: list[dict], settings: dict) -> list[dict]:
        """Run one shard of ``settings["job"]`` (capture, behaviour, counterfactual); one record per item.

        capture: capture and save every item not written by this job yet.

        The shard goes to the backend in one ``capture_many`` call (vLLM: one ``generate``; transformers:
        one item after the other); if that fails with a catchable error, item by item, so one bad item
        fails alone. (The driver decided which items need work; the check here only skips what an
        earlier attempt of this job finished before its replica died.)
        """
        job = settings.get("job", "capture")
        if job != "capture":
            return getattr(self, f"_run_{job}")(items, settings)
        from attnprobe.capture.api import capture_many
        from attnprobe.trajectory.schema import Trajectory

        catch = settings.get("catch") or EXPECTED_ERRORS
        todo, records = [], {}
        for it in items:
            if written_by_job(it["out"], settings["job_start"]):
                records[it["key"]] = {"key": it["key"], "status": "skipped"}
            else:
                todo.append(it)
        kw = {k: settings[k] for k in ("queries", "layers", "chunk_size", "rendering", "max_tokens", "truncate",
                                       "save_qk_layers")}
        groups = [todo] if todo else []
        for group in groups:
            try:
                self._capture_group(group, kw, capture_many, Trajectory)
                records.update({it["key"]: self._record(it, "written") for it in group})
            except catch as exc:
                if len(group) > 1:  # one bad item must not fail the batch: redo the unsaved ones one by one
                    records.update({it["key"]: self._record(it, "written") for it in group if "_tokens" in it})
                    groups.extend([it] for it in group if "_tokens" not in it)
                    continue
                records[group[0]["key"]] = self._failed(group[0], exc)
        return [records[it["key"]] for it in items]

    def _capture_group(self, group, kw, capture_many, Trajectory) -> None:
        trajs = [Trajectory.from_dict(it["trajectory"]) for it in group]
        t0 = time.perf_counter()
        results = capture_many(self.model, trajs, **kw)
        seconds = (time.perf_counter() - t0) / len(group)
        for it, traj, res in zip(group, trajs, results):
            res.meta.update(it["meta"])
            if it.get("ibis") is not None:
                from attnprobe.studies.ibis.framings import segment_categories

                res.meta["ibis"] = {**it["ibis"], "categories": segment_categories(res.segments, traj)}
            res.save(it["out"])
            it["_tokens"], it["_seconds"] = int(len(res.input_ids)), seconds

    @staticmethod
    def _record(it: dict, status: str) -> dict:
        return {"key": it["key"], "status": status, "tokens": it.get("_tokens", 0),
                "seconds": round(it.get("_seconds", 0.0), 4)}

    @staticmethod
    def _failed(it: dict, exc: BaseException) -> dict:
        return {"key": it["key"], "status": "failed", "error_type": type(exc).__name__, "error": str(exc)}

    def _run_behaviour(self, items: list[dict], settings: dict) -> list[dict]:
        """IBIS behaviour: greedy decisions of (item, framing) pairs, returned (the driver appends them to
        decisions.jsonl, so one process writes that file); a batch that fails is redone pair by pair."""
        from attnprobe.generation.transformers_chat import TransformersChat
        from attnprobe.studies.ibis.behaviour import BehaviourBackend, decide_many
        from attnprobe.studies.ibis.items import IbisItem

        if self.load_error is not None:
            raise self.load_error
        key = (settings["early_stop"], settings["forced_choice"])
        if getattr(self, "_behaviour", (None, None))[0] != key:
            self._behaviour = (key, BehaviourBackend(TransformersChat(self.model), early_stop=key[0],
                                                     forced_choice=key[1]))
        backend = self._behaviour[1]
        catch = settings.get("catch") or EXPECTED_ERRORS
        kw = {"max_tokens": settings["max_tokens"], "protocol": settings["protocol"]}
        size = max(1, int(settings.get("batch_size") or 1))
        records: dict[str, dict] = {}
        groups = [items[i:i + size] for i in range(0, len(items), size)]
        for group in groups:
            pairs = [(IbisItem.from_dict(it["item"]), it["framing"]) for it in group]
            try:
                t0 = time.perf_counter()
                decisions = list(decide_many(backend, pairs, batched=len(group) > 1, **kw))
                per = (time.perf_counter() - t0) / len(group)
                for it, dec in zip(group, decisions):
                    records[it["key"]] = {"key": it["key"], "status": "written", "result": dec,
                                          "tokens": int(dec.get("input_tokens") or 0), "seconds": round(per, 4)}
            except catch as exc:
                if len(group) > 1:
                    groups.extend([it] for it in group)
                    continue
                records[group[0]["key"]] = self._failed(group[0], exc)
        return [records[it["key"]] for it in items]

    def _run_counterfactual(self, items: list[dict], settings: dict) -> list[dict]:
        """Counterfactual steps: each item is a batch of steps (as in a single-process run), run with
        :func:`attnprobe.counterfactual.run.run_batch` (which writes every (step, policy) folder
        atomically and skips those already written with the same settings)."""
        from attnprobe.counterfactual.policies import parse_policy
        from attnprobe.counterfactual.run import RunOptions, Step, run_batch
        from attnprobe.trajectory.schema import Trajectory

        if self.load_error is not None:
            raise self.load_error
        catch = settings.get("catch") or EXPECTED_ERRORS
        opts = RunOptions(**settings["opts"])
        policies = [parse_policy(p) if isinstance(p, str) else p for p in settings["policies"]]
        chat = None
        if opts.actions:
            from attnprobe.counterfactual.run import actions_chat

            chat = getattr(self, "_chat", None) or actions_chat(self.model)
            self._chat = chat
        records = []
        for it in items:
            trajs = {k: Trajectory.from_dict(v) for k, v in it["trajectories"].items()}
            steps = [Step(trajs[tid], i, t) for tid, i, t in it["steps"]]
            t0 = time.perf_counter()
            try:
                run_batch(self.model, steps, policies, Path(settings["out"]), opts, chat)
            except catch as exc:
                records.append(self._failed(it, exc))
                continue
            records.append({"key": it["key"], "status": "written", "tokens": int(it["tokens"]),
                            "seconds": round(time.perf_counter() - t0, 4)})
        return records


@dataclass
class _Slot:
    index: int
    handle: Any
    pg: Any = None
    ready: bool = False
    alive: bool = True
    info: dict | None = None
    items: int = 0
    tokens: int = 0
    busy: float = 0.0
    capture: float = 0.0
    shards: int = 0
    status: str = "starting"

    def summary(self) -> dict:
        per_min = 60.0 * self.items / self.busy if self.busy > 0 else None
        return {"replica": self.index, "status": self.status, **(self.info or {}), "shards": self.shards,
                "items": self.items, "tokens": self.tokens, "busy_seconds": round(self.busy, 3),
                "capture_seconds": round(self.capture, 3),
                "items_per_minute": None if per_min is None else round(per_min, 3),
                "tokens_per_second": round(self.tokens / self.busy, 2) if self.busy > 0 else None}


# ------------------------------------------------------------------------------------ the driver
class ReplicaPool:
    """Model replicas on a Ray cluster, started on first need and reused by every job until closed.

    ``with ReplicaPool("default", cluster=Cluster(replicas=2)) as pool: pool.capture(trajs, out)``.
    Use one pool for several jobs (e.g. IBIS item groups) so each replica loads the model once.
    """

    def __init__(self, model_spec: str = "default", *, cluster: Cluster | None = None, backend: str = "transformers",
                 dtype: str = "float32", load_options: dict | None = None, progress: bool = True):
        self.spec, self.backend, self.dtype = str(model_spec), backend, dtype
        self.cluster = cluster or Cluster()
        self.load_options = dict(load_options or {})
        self.progress = progress
        self.id = uuid.uuid4().hex[:8]
        self.slots: list[_Slot] = []
        self.replacements = 0
        self._started_ray = False
        self._connected = False

    # -------------------------------------------------------------- lifecycle
    def __enter__(self) -> ReplicaPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Stop the replicas (and the local Ray instance if this pool started it)."""
        if not self._connected:
            return
        ray = _ray()
        for s in self.slots:
            try:
                ray.kill(s.handle)
            except Exception as exc:  # already gone
                log.debug("replica %d: %s", s.index, exc)
            if s.pg is not None:
                from ray.util.placement_group import remove_placement_group

                remove_placement_group(s.pg)
        self.slots = []
        if self._started_ray:
            ray.shutdown()
        self._connected = self._started_ray = False

    def _connect(self) -> None:
        if not self._connected:
            self._started_ray = connect(self.cluster)
            self._connected = True

    # -------------------------------------------------------------- resources
    def _accepts(self, option: str) -> bool:
        """Whether the backend's ``load`` takes ``option`` (the registry says; no backend names here)."""
        from attnprobe_hooks.backend import get_backend

        return option in get_backend(self.backend).load_options

    def _need(self) -> dict[str, float]:
        """Resources of one replica: GPUs default to the tensor-parallel size for a backend that has
        one (vLLM), to 1 for ``device="cuda"``, else 0."""
        c = self.cluster
        gpus = c.gpus_per_replica
        if gpus is None:
            if self._accepts("tensor_parallel_size"):
                gpus = int(self.load_options.get("tensor_parallel_size", 1) or 1)
            else:
                gpus = 1 if str(self.load_options.get("device", "cpu")).startswith("cuda") else 0
        return {"CPU": float(c.cpus_per_replica), "GPU": float(gpus)}

    def _fit(self) -> int:
        """How many replicas the cluster's live nodes can host; a clear error if not even one."""
        ray = _ray()
        need = self._need()
        nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
        total = {k: sum(n.get(k, 0.0) for n in nodes) for k in ("CPU", "GPU")}
        if self.cluster.tp_across_nodes:
            tp = int(self.load_options.get("tensor_parallel_size", 1) or 1)
            fit = int(total["GPU"] // tp) if tp else 0
        else:
            fit = sum(min(int(n.get(k, 0.0) // v) for k, v in need.items() if v > 0) if any(need.values()) else 1
                      for n in nodes)
        if fit < 1:
            want = ", ".join(f"{v:g} {k}" for k, v in need.items() if v > 0)
            have = ", ".join(f"{v:g} {k}" for k, v in total.items())
            raise AttnprobeError(f"no node of the Ray cluster can host one replica: each needs {want} "
                                 f"(cluster: {len(nodes)} node(s), {have}); lower --ray-gpus-per-replica / "
                                 "--ray-cpus-per-replica or add nodes")
        return fit

    def _start(self, index: int) -> _Slot:
        ray = _ray()
        c = self.cluster
        need = self._need()
        load_options = dict(self.load_options)
        if need["GPU"] > 0 and "device" not in load_options and self._accepts("device"):
            load_options["device"] = "cuda"  # the GPU Ray assigned (CUDA_VISIBLE_DEVICES)
        opts: dict[str, Any] = {"num_cpus": need["CPU"], "num_gpus": need["GPU"], "max_restarts": 1,
                                "max_task_retries": 1, "name": f"attnprobe-replica-{self.id}-{index}"}
        pg = None
        if c.tp_across_nodes and self._accepts("engine_kwargs"):
            # vLLM's Ray executor places one worker per bundle of the actor's placement group.
            from ray.util.placement_group import placement_group
            from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

            tp = int(load_options.get("tensor_parallel_size", 1) or 1)
            pg = placement_group([{"GPU": 1.0, "CPU": 1.0}] * tp, strategy="PACK")
            opts.update(num_cpus=0, num_gpus=0, scheduling_strategy=PlacementGroupSchedulingStrategy(
                pg, placement_group_capture_child_tasks=True))
            load_options["engine_kwargs"] = {**load_options.get("engine_kwargs", {}),
                                             "distributed_executor_backend": "ray"}
        threads = c.torch_threads or max(1, int(c.cpus_per_replica))
        handle = ray.remote(Replica).options(**opts).remote(self.spec, self.backend, self.dtype, load_options, threads)
        slot = _Slot(index=index, handle=handle, pg=pg)
        self.slots.append(slot)
        return slot

    def run_on_replica(self, fn, *args):
        """``fn(loaded_model, *args)`` on one replica (started if none is), e.g. IBIS's framing check,
        which needs the tokenizer the driver never loads. Exceptions come back as themselves."""
        ray = _ray()
        self._connect()
        if not any(s.alive for s in self.slots):
            self._fit()
            self._start(len(self.slots))
        slot = next(s for s in self.slots if s.alive)
        try:
            return ray.get(slot.handle.call.remote(fn, *args))
        except ray.exceptions.RayTaskError as exc:
            cause = getattr(exc, "cause", None)
            if isinstance(cause, BaseException):
                raise cause from None
            raise

    # -------------------------------------------------------------- jobs
    def run_items(self, items: list[dict], settings: dict, *, out: Path, errors_path: Path, stage: str,
                  desc: str, done: Callable[[dict], bool] | None = None, force: bool = False,
                  catch: tuple[type[BaseException], ...] = EXPECTED_ERRORS,
                  on_result: Callable[[dict, dict], None] | None = None) -> dict[str, int]:
        """Run the work items not done yet; the counts of :func:`attnprobe.io.run_resumable`.

        Each item: ``key``, ``tokens`` (estimate), optional ``describe`` (for errors.jsonl) and what
        its job needs; capture items: ``trajectory`` (dict), ``out`` (result folder), ``meta`` (added
        to the result's meta), optional ``ibis``. ``done(item)`` decides what is finished (default
        :func:`is_done` of ``out``); ``force`` redoes everything. ``on_result(item, result)`` is called
        on the driver with what a job returns per item (behaviour: the decision record), in the order
        results arrive.
        """
        from tqdm.auto import tqdm

        t_job = time.time()
        seen: dict[str, dict] = {}
        for it in items:  # two items writing one folder: the last wins, as in a single-process run
            where = it.get("out", it["key"])
            if where in seen:
                log.warning("%s: %s and %s write the same place %s; keeping the last", stage,
                            seen[where]["key"], it["key"], where)
            seen[where] = it
        items = list(seen.values())
        done = done or (lambda it: is_done(it["out"]))
        todo = [it for it in items if force or not done(it)]
        settings = {**settings, "catch": catch}
        counts = {"done_before": len(items) - len(todo), "done": 0, "failed": 0}
        record: dict[str, Any] = {"job": uuid.uuid4().hex[:8], "stage": stage, "pool": self.id,
                                  "started": t_job, "model_spec": self.spec, "backend": self.backend,
                                  "dtype": self.dtype, "cluster": asdict(self.cluster), "items": len(items),
                                  "token_estimate": f"message JSON characters / {CHARS_PER_TOKEN}"}
        if counts["done_before"]:
            log.info("%s: %d of %d already done, skipped", stage, counts["done_before"], len(items))
        if not todo:
            self._write_record(out, {**record, **counts, "shards": 0, "replicas": [], "wall_seconds": 0.0})
            return counts
        settings["job_start"] = fs_now(Path(out))
        self._connect()
        fit = self._fit()
        wanted = self.cluster.replicas or fit
        if wanted > fit:
            log.warning("the cluster hosts %d replica(s) now; the other %d start when resources appear", fit,
                        wanted - fit)
        target = self.cluster.shard_tokens or max(1, -(-sum(it["tokens"] for it in todo)
                                                         // (wanted * SHARDS_PER_REPLICA)))
        shards = [[todo[i] for i in s] for s in make_shards([it["tokens"] for it in todo], target)]
        while len(self.slots) < min(wanted, len(shards)):
            self._start(len(self.slots))
        record.update(shards=len(shards), shard_tokens=target)
        stats = {"resubmitted_shards": 0, "replicas_lost": 0, "written": 0, "written_before_a_retry": 0,
                 "written_twice": 0}
        try:
            with tqdm(total=len(todo), desc=desc, unit="item", disable=not self.progress) as bar:
                self._schedule(deque(shards), settings, counts, stats, bar, errors_path, stage, t_job, on_result)
            # every write of this job has ended: what a killed writer left half-built can go
            for parent in sorted({str(Path(it["out"]).parent) for it in todo if "out" in it}):
                stats.setdefault("recovered_work_folders", []).extend(recover_atomic_dirs(Path(parent)))
        finally:
            record.update(counts, **stats, wall_seconds=round(time.time() - t_job, 3),
                          replicas=[s.summary() for s in self.slots])
            self._write_record(out, record)
        return counts

    def _schedule(self, queue: deque, settings: dict, counts: dict, stats: dict, bar, errors_path: Path,
                  stage: str, t_job: float, on_result: Callable[[dict, dict], None] | None = None) -> None:
        ray = _ray()
        from ray.exceptions import GetTimeoutError, RayActorError

        pending: dict[Any, tuple[str, _Slot, list | None, float]] = {}
        for s in self.slots:
            if s.alive:
                if s.ready:
                    s.status = "idle"
                    stats.setdefault("first_replica_ready_seconds", 0.0)
                else:
                    pending[s.handle.ping.remote()] = ("ping", s, None, time.time())
        load_errors: list[BaseException] = []
        written: set[str] = set()
        while queue or any(kind == "shard" for kind, *_ in pending.values()):
            for s in self.slots:  # hand shards to idle replicas, largest first
                if not queue:
                    break
                if s.alive and s.ready and s.status == "idle":
                    shard = queue.popleft()
                    s.status = "busy"
                    pending[s.handle.run.remote(shard, settings)] = ("shard", s, shard, time.time())
            if not pending:
                if load_errors and not any(s.ready for s in self.slots):
                    raise load_errors[0]
                raise AttnprobeError(f"{stage}: every replica died with {sum(len(q) for q in queue)} items left "
                                     "(rerun to resume; see the Ray logs for why)")
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=10.0)
            if not ready:
                if (not any(s.ready for s in self.slots)
                        and time.time() - t_job > self.cluster.startup_timeout):
                    raise AttnprobeError(f"no replica loaded the model within {self.cluster.startup_timeout:.0f} s "
                                         "(resources busy, or the model load hangs)")
                continue
            ref = ready[0]
            kind, slot, shard, t0 = pending.pop(ref)
            try:
                result = ray.get(ref, timeout=60)
            except (RayActorError, GetTimeoutError) as exc:
                self._lost(slot, shard, queue, stats, exc, pending)
                continue
            except Exception as exc:  # raised inside the actor: a model that cannot load, a bug
                cause = getattr(exc, "cause", None) or exc
                if kind == "ping":
                    slot.alive, slot.status = False, "failed to load"
                    ray.kill(slot.handle)
                    log.error("replica %d could not load %s: %s", slot.index, self.spec, cause)
                    load_errors.append(cause if isinstance(cause, AttnprobeError) else
                                       AttnprobeError(f"replica could not load {self.spec}: {cause}"))
                    continue
                raise AttnprobeError(f"{stage}: replica {slot.index} failed on a shard: "
                                     f"{type(cause).__name__}: {cause}") from None
            if kind == "ping":
                slot.ready, slot.info, slot.status = True, result, "idle"
                stats.setdefault("first_replica_ready_seconds", round(time.time() - t_job, 3))
                continue
            slot.status = "idle"
            slot.shards += 1
            slot.busy += time.time() - t0
            by_key = {it["key"]: it for it in shard}
            for rec in result:
                if rec["status"] == "failed":
                    counts["failed"] += 1
                    it = by_key[rec["key"]]
                    # the replica's exception, re-created by name so errors.jsonl reads as in a single process
                    exc = type(rec["error_type"], (_Remote,), {})(rec["error"])
                    log_error(errors_path, stage, it.get("describe", {"key": it["key"]}), exc)
                    log.warning("%s: %s failed: %s: %s", stage, it["key"], rec["error_type"], rec["error"])
                else:  # "skipped" here means an earlier attempt of this job wrote it
                    counts["done"] += 1
                    if rec["status"] == "skipped":
                        stats["written_before_a_retry"] += 1
                    else:
                        if on_result is not None:
                            on_result(by_key[rec["key"]], rec.get("result"))
                        stats["written"] += 1
                        stats["written_twice"] += rec["key"] in written
                        written.add(rec["key"])
                        slot.items += 1
                        slot.tokens += rec["tokens"]
                        slot.capture += rec["seconds"]
            bar.update(len(shard))

    def _lost(self, slot: _Slot, shard, queue: deque, stats: dict, exc: BaseException, pending: dict) -> None:
        """A replica died: its shard goes back to the front of the queue, a replacement starts."""
        slot.alive, slot.status = False, "died"
        stats["replicas_lost"] += 1
        log.warning("replica %d died (%s)%s", slot.index, type(exc).__name__,
                    f"; its shard of {len(shard)} item(s) goes to another replica" if shard else "")
        if shard is not None:
            queue.appendleft(shard)
            stats["resubmitted_shards"] += 1
        budget = self.cluster.max_replacements
        budget = (self.cluster.replicas or len(self.slots)) if budget is None else budget
        if self.replacements < budget:
            self.replacements += 1
            new = self._start(len(self.slots))
            pending[new.handle.ping.remote()] = ("ping", new, None, time.time())

    def _write_record(self, out: Path, record: dict) -> None:
        path = Path(out) / RUN_FILE
        runs = []
        if path.is_file():
            try:
                runs = json.loads(path.read_text(encoding="utf-8")).get("runs", [])
            except (OSError, json.JSONDecodeError, AttributeError):
                log.warning("%s: unreadable, starting a new one", path)
        runs.append(record)
        atomic_write_text(path, json.dumps({"format_version": 1, "runs": runs}, indent=1, default=str))

    # -------------------------------------------------------------- the two job kinds
    def capture(self, trajectories: Iterable, out: str | Path, *, queries: str | Sequence[int] = "reasoning",
                layers: Sequence[int] | None = None, chunk_size: int | None = None, rendering: str = "auto",
                max_tokens: int | None = None, truncate: bool = False, save_qk_layers: Sequence[int] = (),
                extra_meta: dict | None = None, done: Callable[[Any], bool] | None = None, force: bool = False,
                catch: tuple[type[BaseException], ...] = EXPECTED_ERRORS) -> dict[str, int]:
        """Capture trajectories into ``out/<safe id>/``, as ``attnprobe capture`` does.

        ``extra_meta`` is added to every result's meta.json (the CLI: ``{"cli_settings": ...}``).
        ``done(trajectory)`` says what is finished; default: meta.json present with ``extra_meta``'s
        values (``attnprobe capture`` passes its own stricter check).
        """
        from attnprobe.io import safe_name

        out = Path(out)
        trajectories = list(trajectories)
        by_id = {t.id: t for t in trajectories}
        extra = json.loads(json.dumps(extra_meta or {}))
        items = [{"key": t.id, "trajectory": t.to_dict(), "out": str(out / safe_name(t.id)), "meta": extra,
                  "tokens": estimate_tokens(t, max_tokens if truncate else None),
                  "describe": {"trajectory_id": t.id}} for t in trajectories]
        if not items:
            raise AttnprobeError("no trajectories to capture")
        settings = {"queries": queries if isinstance(queries, str) else [int(q) for q in queries],
                    "layers": None if layers is None else [int(x) for x in layers], "chunk_size": chunk_size,
                    "rendering": rendering, "max_tokens": max_tokens, "truncate": truncate,
                    "save_qk_layers": [int(x) for x in save_qk_layers]}
        check = ((lambda it: done(by_id[it["key"]])) if done is not None else
                 (lambda it: is_done(it["out"], extra or None)))
        return self.run_items(items, settings, out=out, errors_path=out / "errors.jsonl", stage="capture",
                              desc="capture", done=check, force=force, catch=catch)

    def ibis_attention(self, items: Sequence, folder: str | Path, *, framings: Sequence[str] | None = None,
                       chunk_size: int = 512, force: bool = False, protocol: str = "paper") -> dict[str, int]:
        """:func:`attnprobe.studies.ibis.attention.run_attention` on the cluster (same folders, same meta)."""
        from attnprobe.studies.ibis.attention import capture_dir
        from attnprobe.studies.ibis.framings import FRAMINGS, build_framing

        folder = Path(folder)
        work = []
        for it in items:
            for fr in framings or FRAMINGS:
                traj = build_framing(it, fr, protocol)
                work.append({"key": f"{it.id}/{fr}", "trajectory": traj.to_dict(),
                             "out": str(capture_dir(folder, it.id, fr)), "meta": {}, "tokens": estimate_tokens(traj),
                             "ibis": {"item_id": it.id, "framing": fr, "label": it.label, "protocol": protocol},
                             "describe": {"item_id": it.id, "framing": fr}})
        settings = {"queries": "decision", "layers": None, "chunk_size": chunk_size, "rendering": "auto",
                    "max_tokens": None, "truncate": False, "save_qk_layers": []}
        counts = self.run_items(work, settings, out=folder, errors_path=folder / "errors.jsonl", stage="attention",
                                desc="ibis attention", force=force)
        return {"done_before": counts["done_before"], "captured": counts["done"], "failed": counts["failed"]}


    def ibis_behaviour(self, items: Sequence, folder: str | Path, *, framings: Sequence[str] | None = None,
                       max_tokens: int | None = None, protocol: str = "paper", batch_size: int = 1,
                       early_stop: bool = True, forced_choice: bool = True, force: bool = False) -> dict[str, int]:
        """:func:`attnprobe.studies.ibis.behaviour.run_behaviour` on the cluster: the replicas generate,
        the driver appends each decision to ``folder/decisions.jsonl`` as it arrives (one writer)."""
        from attnprobe.io import append_jsonl
        from attnprobe.studies.ibis.behaviour import DEFAULT_MAX_NEW_TOKENS, read_decisions
        from attnprobe.studies.ibis.framings import FRAMINGS, build_framing

        folder = Path(folder)
        path = folder / "decisions.jsonl"
        finished = set() if force else {(r["item_id"], r["framing"]) for r in read_decisions(path)}
        work = [{"key": f"{it.id}/{fr}", "item": it.to_dict(), "framing": fr,
                 "tokens": estimate_tokens(build_framing(it, fr, protocol)),
                 "describe": {"item_id": it.id, "framing": fr}} for it in items for fr in (framings or FRAMINGS)]
        settings = {"job": "behaviour", "max_tokens": int(max_tokens or DEFAULT_MAX_NEW_TOKENS), "protocol": protocol,
                    "batch_size": int(batch_size), "early_stop": bool(early_stop), "forced_choice": bool(forced_choice)}
        counts = self.run_items(work, settings, out=folder, errors_path=folder / "errors.jsonl", stage="behaviour",
                                desc="ibis behaviour", done=lambda w: (w["describe"]["item_id"], w["framing"]) in finished,
                                force=force, on_result=lambda _w, rec: append_jsonl(path, rec))
        return {"done_before": counts["done_before"], "decided": counts["done"], "failed": counts["failed"]}

    def counterfactual(self, trajectories: Iterable, policies: Sequence, out: str | Path, *, opts=None,
                       min_past: int = 5, include_actions: bool = False, turns: Sequence[int] | None = None,
                       max_steps: int | None = None, batch_size: int = 1, force: bool = False) -> dict[str, int]:
        """:func:`attnprobe.counterfactual.run.run_counterfactuals` on the cluster: the same folders,
        records and resume. ``policies``: specs (``"mask:5"``, parsed on each replica) or policy objects
        Ray can serialise. A work item is a batch of ``batch_size`` steps cut exactly as a single-process
        run cuts them (steps of one trajectory in a batch share the original's prefill); ``opts.actions``
        generates with the replica's model. Counts are steps, as in one process."""
        from attnprobe.counterfactual.run import RunOptions, clear_steps, plan_steps, step_done

        opts = opts or RunOptions()
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        names, steps = plan_steps(trajectories, policies, min_past=min_past, include_actions=include_actions,
                                  turns=turns, max_steps=max_steps)
        settings = self.run_on_replica(_counterfactual_settings, names, asdict(opts))  # also checks --actions

        def step_finished(s) -> bool:
            return all(step_done(out, s, n, settings[n]) for n in names)

        if force:
            clear_steps(out, steps, names)
        # the batches of a single-process run (run_resumable: the steps not done, in order, batch_size at a
        # time), so each original is prefilled to the same length and the numbers are the same bit for bit
        todo = [s for s in steps if not step_finished(s)]
        size = max(1, batch_size)
        work = []
        for b in range(0, len(todo), size):
            group = todo[b:b + size]
            trajs = {s.trajectory.id: s.trajectory for s in group}
            tokens = sum(estimate_tokens(replace(s.trajectory, messages=s.trajectory.messages[: s.message_index + 1]))
                         for s in group) * (1 + len(names))
            work.append({"key": f"{group[0].trajectory.id}#{group[0].key}+{len(group)}",
                         "trajectories": {k: t.to_dict() for k, t in trajs.items()},
                         "steps": [[s.trajectory.id, s.message_index, s.turn] for s in group], "tokens": tokens,
                         "describe": {"trajectory_id": group[0].trajectory.id, "step": group[0].message_index,
                                      "steps": len(group)}})
        job = {"job": "counterfactual", "out": str(out), "opts": asdict(opts), "policies": list(policies)}
        if work:
            self.run_items(work, job, out=out, errors_path=out / "errors.jsonl", stage="counterfactual",
                           desc="counterfactual", done=lambda w: False)
        finished = sum(step_finished(s) for s in todo)
        return {"done_before": len(steps) - len(todo), "done": finished, "failed": len(todo) - finished}


def _counterfactual_settings(model, names: list[str], opts: dict) -> dict:  # runs on a replica
    from attnprobe.counterfactual.run import RunOptions, actions_chat, settings_dict

    if opts["actions"]:
        actions_chat(model)  # refused before any work for a model that cannot generate in process
    return {n: settings_dict(model, n, RunOptions(**opts)) for n in names}


class _Remote(Exception):
    """Base of the stand-ins for exceptions raised on a replica (only their name and message travel)."""


# ------------------------------------------------------------------------------------ one-call API
def capture_distributed(model_spec: str, trajectories: Iterable, out: str | Path, *, cluster: Cluster | None = None,
                        replicas: int | None = None, backend: str = "transformers", dtype: str = "float32",
                        chunk_size: int | None = None, queries: str | Sequence[int] = "reasoning",
                        load_options: dict | None = None, progress: bool = True, **capture_kw) -> dict[str, int]:
    """Capture ``trajectories`` into ``out`` on a Ray cluster (see :class:`ReplicaPool.capture` for
    the rest of the options); returns ``{"done_before", "done", "failed"}``."""
    cluster = cluster or Cluster()
    if replicas is not None:
        cluster = Cluster(**{**asdict(cluster), "replicas": int(replicas)})
    with ReplicaPool(model_spec, cluster=cluster, backend=backend, dtype=dtype, load_options=load_options,
                     progress=progress) as pool:
        return pool.capture(trajectories, out, queries=queries, chunk_size=chunk_size, **capture_kw)


def ibis_attention_distributed(model_spec: str, items: Sequence, folder: str | Path, *,
                               cluster: Cluster | None = None, dtype: str = "float32",
                               load_options: dict | None = None, progress: bool = True, **kw) -> dict[str, int]:
    """IBIS attention capture on a Ray cluster (behaviour generation stays single-process)."""
    with ReplicaPool(model_spec, cluster=cluster, dtype=dtype, load_options=load_options,
                     progress=progress) as pool:
        return pool.ibis_attention(items, folder, **kw)


# ------------------------------------------------------------------------------------ CLI glue
def add_cluster_options(parser: argparse.ArgumentParser):
    """The "cluster (Ray)" group: --ray [ADDRESS] and the per-replica resources."""
    g = parser.add_argument_group("cluster (Ray)")
    g.add_argument("--ray", nargs="?", const="local", default=None, metavar="ADDRESS",
                   help="run on Ray replicas: no ADDRESS starts a local Ray instance; 'auto' joins this machine's "
                        "cluster; host:port or ray://host:port a remote one (docs/scale.md). Needs attnprobe[ray]")
    g.add_argument("--ray-replicas", type=int, default=None,
                   help="model replicas (default: as many as the cluster's resources allow)")
    g.add_argument("--ray-cpus-per-replica", type=float, default=1.0, help="CPUs each replica reserves (default 1)")
    g.add_argument("--ray-gpus-per-replica", type=float, default=None,
                   help="GPUs each replica reserves (default: --tensor-parallel-size for vllm, 1 with --device "
                        "cuda, else 0)")
    g.add_argument("--ray-tp-across-nodes", action="store_true",
                   help="vllm: a replica's tensor-parallel ranks may span nodes (vLLM's Ray executor)")
    g.add_argument("--ray-shard-tokens", type=int, default=None,
                   help="estimated tokens per shard (default: total / (4 x replicas))")
    return g


def cluster_from_args(args: argparse.Namespace) -> Cluster | None:
    """The :class:`Cluster` the options describe, or None without --ray."""
    address = getattr(args, "ray", None)
    if address is None:
        return None
    for name in ("ray_replicas", "ray_shard_tokens"):
        v = getattr(args, name, None)
        if v is not None and v < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1")
    return Cluster(address=check_address(address), replicas=args.ray_replicas,
                   cpus_per_replica=args.ray_cpus_per_replica, gpus_per_replica=args.ray_gpus_per_replica,
                   tp_across_nodes=args.ray_tp_across_nodes, shard_tokens=args.ray_shard_tokens)
