"""Items per minute: single-process capture vs Ray replicas (attnprobe.distributed), same items.

The items are the shipped sample trajectories, cycled under new ids up to ``--items`` and cut to
``--max-tokens`` (0 = full length). For every replica count the job runs in a fresh pool (replicas
start and load the model inside the measured wall time), and the table shows:

- end-to-end items/min (wall time including Ray start, replica start and model load);
- steady items/min: items / (wall - time until the first replica was ready);
- overhead per item: (sum of replica busy time - sum of capture time) / items, i.e. what one item
  costs beyond its forward pass on a replica: Ray round trip, (de)serialising the trajectory, the
  done-check and the atomic save (the single-process row shows the save alone);
- the bare Ray round trip of one actor call (``ping``), the scheduling cost per shard.

Every mode runs ``--rounds`` times, interleaved, because a shared machine's load drifts; the load
average is recorded per row. The single process keeps its model between rounds (startup 0 after
the first); every Ray row starts Ray and its replicas afresh.

    python benchmarks/ray_capture.py                                   # this machine, 1 and 2 replicas
    python benchmarks/ray_capture.py --address auto --backend vllm --model /models/Qwen3-8B \\
        --dtype bfloat16 --replicas 1,4,8 --items 64 --max-tokens 0 --no-single
    python benchmarks/ray_capture.py --address auto --backend vllm --tensor-parallel-size 2 --replicas 4 ...

Writes ``<out>/ray_capture.json`` and ``<out>/ray_capture.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def make_items(n: int, files: list[str] | None):
    from attnprobe.resources import SAMPLE_TRAJECTORIES, data_path
    from attnprobe.trajectory.schema import Trajectory, load_trajectories

    base = [t for f in (files or [data_path(x) for x in SAMPLE_TRAJECTORIES]) for t in load_trajectories(f)]
    out = []
    for i in range(n):
        d = base[i % len(base)].to_dict()
        d["id"] = f"{d['id']}#{i // len(base)}"
        out.append(Trajectory.from_dict(d))
    return out


def capture_options(args) -> dict:
    opts = {"queries": "reasoning+decision", "chunk_size": args.chunk_size}
    if args.max_tokens:
        opts.update(max_tokens=args.max_tokens, truncate=True)
    return opts


def load_options(args) -> dict:
    from attnprobe_hooks.backend import applicable_options

    return applicable_options(args.backend, {"device": args.device, "tensor_parallel_size": args.tensor_parallel_size,
                                             "chunk_size": args.chunk_size})


def run_single(args, items, work: Path, threads: int | None) -> dict:
    """The single-process path of ``attnprobe capture``: load once, capture and save item by item."""
    import torch

    from attnprobe.capture.api import capture
    from attnprobe.capture.models import load_model
    from attnprobe.io import safe_name

    if threads:
        torch.set_num_threads(threads)
    t0 = time.perf_counter()
    model = load_model(args.model, backend=args.backend, dtype=args.dtype, **load_options(args))
    load_s = time.perf_counter() - t0
    cap_s = save_s = 0.0
    tokens = 0
    for t in items:
        a = time.perf_counter()
        res = capture(model, t, **capture_options(args))
        b = time.perf_counter()
        res.save(work / safe_name(t.id))
        cap_s += b - a
        save_s += time.perf_counter() - b
        tokens += len(res.input_ids)
    wall = time.perf_counter() - t0
    n = len(items)
    return {"mode": f"single process, {torch.get_num_threads()} thread(s)", "replicas": 0, "torch_threads": torch.get_num_threads(), "items": n,
            "tokens": tokens, "wall_s": round(wall, 2), "startup_s": round(load_s, 2),
            "items_per_min": round(60 * n / wall, 2), "steady_items_per_min": round(60 * n / (wall - load_s), 2),
            "capture_s_per_item": round(cap_s / n, 3), "overhead_s_per_item": round(save_s / n, 4),
            "note": "overhead = the atomic save alone"}


def run_ray(args, items, work: Path, replicas: int) -> dict:
    import ray

    from attnprobe.capture.job import CaptureJob, CaptureOptions
    from attnprobe.capture.models import ModelSpec
    from attnprobe.distributed import RUN_FILE, Cluster, RayExecutor

    cluster = Cluster(address=args.address, replicas=replicas, cpus_per_replica=args.cpus_per_replica,
                      gpus_per_replica=args.gpus_per_replica, tp_across_nodes=args.tp_across_nodes,
                      num_cpus=args.num_cpus, shard_tokens=args.shard_tokens)
    t0 = time.perf_counter()
    model = ModelSpec(args.model, args.backend, args.dtype, load_options(args))
    with RayExecutor(model, cluster=cluster, progress=False) as pool:
        counts = pool.run(CaptureJob(work, items, CaptureOptions(**capture_options(args)), model=args.model,
                                     backend=args.backend, dtype=args.dtype))
        wall = time.perf_counter() - t0
        live = [s for s in pool.slots if s.alive and s.ready]
        a = time.perf_counter()
        for _ in range(args.pings):
            ray.get(live[0].handle.ping.remote())
        ping_ms = 1000 * (time.perf_counter() - a) / args.pings
    run = json.loads((work / RUN_FILE).read_text())["runs"][-1]
    n = counts["done"]
    reps = run["replicas"]
    busy = sum(r["busy_seconds"] for r in reps)
    cap = sum(r["capture_seconds"] for r in reps)
    start = min(wall, run.get("first_replica_ready_seconds", 0.0))  # includes starting Ray (job start = t0)
    return {"mode": f"ray, {replicas} replica(s)", "replicas": replicas, "items": n, "failed": counts["failed"],
            "tokens": sum(r["tokens"] for r in reps), "shards": run["shards"], "wall_s": round(wall, 2),
            "startup_s": round(start, 2), "items_per_min": round(60 * n / wall, 2),
            "steady_items_per_min": round(60 * n / max(1e-9, wall - start), 2),
            "capture_s_per_item": round(cap / max(1, n), 3), "overhead_s_per_item": round((busy - cap) / max(1, n), 4),
            "ray_round_trip_ms": round(ping_ms, 2),
            "per_replica": [{k: r.get(k) for k in ("replica", "host", "gpus", "load_seconds", "items", "tokens",
                                                   "busy_seconds", "items_per_minute", "tokens_per_second")}
                            for r in reps]}


def _tag(row: dict, k: int) -> None:
    row.update(round=k + 1, loadavg_1min=round(os.getloadavg()[0], 1))
    print({k: v for k, v in row.items() if k != "per_replica"}, flush=True)


def _mode(row: dict) -> str:
    threads = row.get("torch_threads")
    return row["mode"] + (f", {threads} thread(s)" if threads and "thread" not in row["mode"] else "")


def markdown(rows: list[dict], env: dict) -> str:
    head = ("| round | mode | load avg | items | wall s | startup s | items/min (end to end) | items/min (steady) "
            "| capture s/item | overhead s/item | Ray round trip ms |\n"
            "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
    body = "".join(f"| {r['round']} | {_mode(r)} | {r['loadavg_1min']} | {r['items']} | {r['wall_s']} | "
                   f"{r['startup_s']} | {r['items_per_min']} | "
                   f"{r['steady_items_per_min']} | {r['capture_s_per_item']} | {r['overhead_s_per_item']} | "
                   f"{r.get('ray_round_trip_ms', '')} |\n" for r in rows)
    return (f"Model {env['model']} ({env['backend']}, {env['dtype']}), {env['items']} items of at most "
            f"{env['max_tokens'] or 'full'} tokens, chunk {env['chunk_size']}; {env['cpus']} CPU cores, load average "
            f"{env['loadavg']} at the start; Ray {env['ray']}."
            + "".join(f" Rows appended by a later run (load average {e['loadavg']})." for e in env.get("appended", []))
            + "\n\n" + head + body)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--address", default=None, help="Ray address (default: a local instance); auto, host:port")
    ap.add_argument("--backend", default="transformers", choices=("transformers", "vllm"))
    ap.add_argument("--model", default="default")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--device", default="cpu", help="transformers device of the single-process path")
    ap.add_argument("--tensor-parallel-size", type=int, default=1)
    ap.add_argument("--replicas", default="1,2", help="replica counts to measure, e.g. 1,2 or 1,4,8")
    ap.add_argument("--cpus-per-replica", type=float, default=1.0)
    ap.add_argument("--gpus-per-replica", type=float, default=None)
    ap.add_argument("--tp-across-nodes", action="store_true")
    ap.add_argument("--num-cpus", type=int, default=None, help="CPUs of a local Ray instance (default: all)")
    ap.add_argument("--shard-tokens", type=int, default=None)
    ap.add_argument("--items", type=int, default=8)
    ap.add_argument("--trajectories", nargs="*", default=None, help="JSONL files (default: the shipped samples)")
    ap.add_argument("--max-tokens", type=int, default=512, help="truncate items to this many tokens (0 = full)")
    ap.add_argument("--chunk-size", type=int, default=512)
    ap.add_argument("--no-single", action="store_true", help="skip the single-process row (e.g. on a cluster)")
    ap.add_argument("--single-threads", default="",
                    help="torch threads of the single process, one row each, e.g. 1,2 (default: torch's default)")
    ap.add_argument("--append", action="store_true", help="add the rows to an existing ray_capture.json")
    ap.add_argument("--pings", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=2,
                    help="repeat every mode this many times, interleaved (a shared machine's load drifts)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    import ray

    items = make_items(args.items, args.trajectories)
    env = {"model": args.model, "backend": args.backend, "dtype": args.dtype, "items": len(items),
           "max_tokens": args.max_tokens, "chunk_size": args.chunk_size, "cpus": os.cpu_count(),
           "loadavg": " / ".join(f"{x:.1f}" for x in os.getloadavg()), "ray": ray.__version__,
           "address": args.address or "local"}
    rows = []
    work = Path(tempfile.mkdtemp(prefix="ray-bench-"))
    try:
        for k in range(args.rounds):
            if not args.no_single:
                for threads in [int(x) for x in args.single_threads.split(",") if x] or [None]:
                    rows.append(run_single(args, items, work / f"single{k}-{threads}", threads))
                    _tag(rows[-1], k)
            for r in [int(x) for x in args.replicas.split(",") if x]:
                rows.append(run_ray(args, items, work / f"ray{r}-{k}", r))
                _tag(rows[-1], k)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.append and (out / "ray_capture.json").is_file():
        old = json.loads((out / "ray_capture.json").read_text())
        rows = old["rows"] + rows
        env = {**old["env"], "appended": old.get("env", {}).get("appended", []) + [env]}
    (out / "ray_capture.json").write_text(json.dumps({"env": env, "rows": rows}, indent=1))
    (out / "ray_capture.md").write_text(markdown(rows, env))
    print(markdown(rows, env))


if __name__ == "__main__":
    main()
