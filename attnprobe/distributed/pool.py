"""Model replicas on a Ray cluster and the scheduling of a job's shards over them.

Scheduling: a job's batches are grouped into shards of about ``shard_tokens`` estimated tokens
(first-fit decreasing; a batch larger than the target is a shard of its own) and handed largest first
to whichever replica is idle, so long trajectories do not pile up on one replica. A replica that dies
has its shard put back in the queue for the others (and a replacement is started, up to
``max_replacements``); Ray's own actor restarts and task retries cover crashes it can restart by
itself. The driver writes ``distributed.json`` into the job's folder: one record per job with
per-replica throughput.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections import deque
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from attnprobe.capture.models import ModelSpec
from attnprobe.distributed.cluster import Cluster, connect, ray_module
from attnprobe.distributed.replica import Replica
from attnprobe.distributed.shards import SHARDS_PER_REPLICA, fs_now, make_shards
from attnprobe.errors import AttnprobeError
from attnprobe.execution.job import Job, batches
from attnprobe.io import ERRORS_FILE, atomic_write_text, load_json, log_error
from attnprobe.trajectory.schema import CHARS_PER_TOKEN

log = logging.getLogger(__name__)

RUN_FILE = "distributed.json"


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



class RayExecutor:
    """The Ray executor: model replicas on a Ray cluster, started on first need and reused by every job
    until closed.

    ``with RayExecutor(ModelSpec("default"), cluster=Cluster(replicas=2)) as ex: ex.run(job)``.
    Use one pool for several jobs (e.g. IBIS item groups) so each replica loads the model once.
    """

    shards = True  # work is spread over replicas: callers hand it whole sets, not small groups

    def __init__(self, model: ModelSpec | str = "default", *, cluster: Cluster | None = None,
                 progress: bool = True):
        model = model if isinstance(model, ModelSpec) else ModelSpec(str(model))
        self.model = model
        self.spec, self.backend, self.dtype = model.spec, model.backend, model.dtype
        self.cluster = cluster or Cluster()
        self.load_options = dict(model.load_options)
        self.progress = progress
        self.id = uuid.uuid4().hex[:8]
        self.slots: list[_Slot] = []
        self.replacements = 0
        self._started_ray = False
        self._connected = False

    # -------------------------------------------------------------- lifecycle
    def __enter__(self) -> RayExecutor:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Stop the replicas (and the local Ray instance if this pool started it)."""
        if not self._connected:
            return
        ray = ray_module()
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
        ray = ray_module()
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
        ray = ray_module()
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

    def call(self, fn, *args):
        """``fn(loaded_model, *args)`` on one replica (started if none is), e.g. IBIS's framing check,
        which needs the tokenizer the driver never loads. Exceptions come back as themselves."""
        ray = ray_module()
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
    def run(self, job: Job) -> dict[str, int]:
        """Run the job's unfinished items on the replicas; ``{"done_before", "done", "failed"}``.

        The batches are cut as the local executor cuts them (:func:`attnprobe.execution.job.batches`);
        a shard is a group of whole batches of about ``shard_tokens`` estimated tokens, handed largest
        first to whichever replica is idle. What ``job.run`` returns is handed to ``job.collect`` here,
        in the order results arrive."""
        from attnprobe.io import progress_bar

        t_job = time.time()
        out = Path(job.out)
        items = job.items()
        keys = [it.key for it in items]
        if len(set(keys)) != len(keys):
            dup = next(k for k in keys if keys.count(k) > 1)
            raise AttnprobeError(f"{job.stage}: work item {dup!r} appears twice (two inputs would write one place)")
        todo = list(items) if job.force else [it for it in items if not job.done(it)]
        counts = {"done_before": len(items) - len(todo), "done": 0, "failed": 0}
        record: dict[str, Any] = {"job": uuid.uuid4().hex[:8], "stage": job.stage, "pool": self.id,
                                  "started": t_job, "model_spec": self.spec, "backend": self.backend,
                                  "dtype": self.dtype, "cluster": asdict(self.cluster), "items": len(items),
                                  "token_estimate": f"message JSON characters / {CHARS_PER_TOKEN}"}
        if counts["done_before"]:
            log.info("%s: %d of %d already done, skipped", job.stage, counts["done_before"], len(items))
        if not todo:
            self._write_record(out, {**record, **counts, "shards": 0, "replicas": [], "wall_seconds": 0.0,
                                     "recovered_work_folders": job.finish()})
            return counts
        job_start = fs_now(out)
        self._connect()
        fit = self._fit()
        wanted = self.cluster.replicas or fit
        if wanted > fit:
            log.warning("the cluster hosts %d replica(s) now; the other %d start when resources appear", fit,
                        wanted - fit)
        groups = batches(todo, job.batch_size)
        sizes = [sum(it.tokens for it in g) for g in groups]
        target = self.cluster.shard_tokens or max(1, -(-sum(sizes) // (wanted * SHARDS_PER_REPLICA)))
        shards = [[groups[i] for i in s] for s in make_shards(sizes, target)]
        while len(self.slots) < min(wanted, len(shards)):
            self._start(len(self.slots))
        record.update(shards=len(shards), shard_tokens=target)
        stats = {"resubmitted_shards": 0, "replicas_lost": 0, "written": 0, "written_before_a_retry": 0,
                 "written_twice": 0}
        ray = ray_module()
        job_ref = ray.put(job)  # shipped once, not with every shard
        try:
            with progress_bar(total=len(todo), desc=job.stage, unit=job.unit, disable=not self.progress) as bar:
                self._schedule(deque(shards), job, job_ref, job_start, counts, stats, bar, t_job)
            # every write of this job has ended: what a killed writer left half-built can go
            stats["recovered_work_folders"] = job.finish()
        finally:
            record.update(counts, **stats, wall_seconds=round(time.time() - t_job, 3),
                          replicas=[s.summary() for s in self.slots])
            self._write_record(out, record)
        return counts

    def _schedule(self, queue: deque, job: Job, job_ref, job_start: float, counts: dict, stats: dict, bar,
                  t_job: float) -> None:
        ray = ray_module()
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
                    pending[s.handle.run.remote(job_ref, shard, job_start)] = ("shard", s, shard, time.time())
            if not pending:
                if load_errors and not any(s.ready for s in self.slots):
                    raise load_errors[0]
                left = sum(len(b) for shard in queue for b in shard)
                raise AttnprobeError(f"{job.stage}: every replica died with {left} items left "
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
                raise AttnprobeError(f"{job.stage}: replica {slot.index} failed on a shard: "
                                     f"{type(cause).__name__}: {cause}") from None
            if kind == "ping":
                slot.ready, slot.info, slot.status = True, result, "idle"
                stats.setdefault("first_replica_ready_seconds", round(time.time() - t_job, 3))
                continue
            slot.status = "idle"
            slot.shards += 1
            slot.busy += time.time() - t0
            by_key = {it.key: it for batch in shard for it in batch}
            for rec in result:
                it = by_key[rec["key"]]
                if rec["status"] == "failed":
                    counts["failed"] += 1
                    # the replica's exception, re-created by name so errors.jsonl reads as in a single process
                    exc = type(rec["error_type"], (_Remote,), {})(rec["error"])
                    log_error(Path(job.out) / ERRORS_FILE, job.stage, it.describe or {"key": it.key}, exc)
                    log.warning("%s: %s failed: %s: %s", job.stage, it.key, rec["error_type"], rec["error"])
                    continue
                counts["done"] += 1  # "skipped" here means an earlier attempt of this job wrote it
                if rec["status"] == "skipped":
                    stats["written_before_a_retry"] += 1
                    continue
                job.collect(it, rec.get("result"))
                stats["written"] += 1
                stats["written_twice"] += rec["key"] in written
                written.add(rec["key"])
                slot.items += 1
                slot.tokens += rec["tokens"]
                slot.capture += rec["seconds"]
            bar.update(len(by_key))

    def _lost(self, slot: _Slot, shard, queue: deque, stats: dict, exc: BaseException, pending: dict) -> None:
        """A replica died: its shard goes back to the front of the queue, a replacement starts."""
        slot.alive, slot.status = False, "died"
        stats["replicas_lost"] += 1
        n = sum(len(b) for b in shard) if shard else 0
        log.warning("replica %d died (%s)%s", slot.index, type(exc).__name__,
                    f"; its shard of {n} item(s) goes to another replica" if shard else "")
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
                doc = load_json(path)
                runs = doc.get("runs", []) if isinstance(doc, dict) else []
            except AttnprobeError:
                log.warning("%s: unreadable, starting a new one", path)
        runs.append(record)
        atomic_write_text(path, json.dumps({"format_version": 1, "runs": runs}, indent=1, default=str))


class _Remote(Exception):
    """Base of the stand-ins for exceptions raised on a replica (only their name and message travel)."""
