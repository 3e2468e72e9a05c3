"""Where replicas run: the :class:`Cluster` description and joining (or starting) a Ray instance."""

from __future__ import annotations

import re
import socket
from dataclasses import dataclass
from typing import Any

from attnprobe.errors import AttnprobeError
from attnprobe.io.options import non_negative_float, option, positive_int

RAY_HINT = "Ray is not installed: pip install 'attnprobe[ray]'"


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

    # The "cluster (Ray)" option group is these fields (attnprobe.io.options); --ray's absence (None on the
    # command line) means no cluster at all, so a Cluster is only built when it is given.
    address: str | None = option(None, flag="--ray", nargs="?", const="local", metavar="ADDRESS",
                                 help="run on Ray replicas: no ADDRESS starts a local Ray instance; 'auto' joins this "
                                      "machine's cluster; host:port or ray://host:port a remote one (docs/scale.md). "
                                      "Needs attnprobe[ray]")
    replicas: int | None = option(None, flag="--ray-replicas", type=positive_int,
                                  help="model replicas (default: as many as the cluster's resources allow)")
    cpus_per_replica: float = option(1.0, flag="--ray-cpus-per-replica", type=non_negative_float,
                                     help="CPUs each replica reserves (default {default:g})")
    gpus_per_replica: float | None = option(None, flag="--ray-gpus-per-replica", type=non_negative_float,
                                            help="GPUs each replica reserves (default: --tensor-parallel-size for "
                                                 "vllm, 1 with --device cuda, else 0)")
    tp_across_nodes: bool = option(False, flag="--ray-tp-across-nodes", action="store_true",
                                   help="vllm: a replica's tensor-parallel ranks may span nodes (vLLM's Ray executor)")
    shard_tokens: int | None = option(None, flag="--ray-shard-tokens", type=positive_int,
                                      help="estimated tokens per shard (default: total / (4 x replicas))")
    num_cpus: int | None = None  # local instance only (default: every core)
    max_replacements: int | None = None  # replicas started to replace dead ones (default: replicas)
    torch_threads: int | None = None  # per replica (default: cpus_per_replica, at least 1)
    startup_timeout: float = 1800.0  # seconds to wait for the first replica to load its model
    log_to_driver: bool = False  # replica stdout/stderr on the driver (GGUF conversion bars are noisy)


def ray_module():
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
    ray = ray_module()
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
