"""Option groups shared by several commands, declared once (same names, help, choices and defaults everywhere).
An option that sets a record's field is declared on that field (``attnprobe.io.options.option``) and
added here with ``add_options``; the others are declared below.

Groups (each an argparse argument group, so ``--help`` shows them under their own title):

- :func:`add_model_options` ("model"): the fields of :class:`~attnprobe.capture.models.ModelOptions`,
  ``--model``, ``--dtype``, ``--device``; with ``backends`` also the capture ``--backend`` and
  ``--tensor-parallel-size``; :func:`model_options` gives the ``ModelSpec`` to load.
- :func:`add_capture_options` ("capture"): ``--chunk-size`` and, for trajectory capture, ``--queries``,
  ``--layers``, ``--rendering``, ``--max-tokens``, ``--truncate``, ``--save-qk-layers``, ``--no-prefix-sharing``:
  the fields of :class:`~attnprobe.capture.job.CaptureOptions`, which declares them
  (:mod:`attnprobe.io.options`); :func:`capture_options` reads them back.
- :func:`add_generation_options` ("generation"): the fields of
  :class:`~attnprobe.generation.factory.GenerationOptions` (``--generator``, old name on ``ibis run``:
  ``--backend``; ``--base-url``, ``--served-model``, ``--api-key-env``, ``--request-timeout``,
  ``--max-reply-bytes``, ``--concurrency``), then ``--max-new-tokens`` and optionally ``--temperature``.
- :func:`add_cluster_options` ("cluster (Ray)"): the fields of :class:`~attnprobe.distributed.cluster.Cluster`
  (``--ray`` and the per-replica resources); :func:`cluster_options` builds one only when ``--ray`` is given.
- :func:`add_output_options` ("output"): ``--out``, ``--force``, ``--no-progress``.

:func:`finish_args` runs after parsing (``attnprobe.cli.main`` calls it) and resolves what depends on
several options (the generator kind). :func:`make_generator` opens the generation backend the options
describe.
"""

from __future__ import annotations

import argparse
import logging
from dataclasses import dataclass, replace

from attnprobe.io.options import (  # noqa: F401  (re-exported: the commands' argparse types)
    CLI,
    MAX_LIST_ITEMS,
    OnceAction,
    add_deprecated_alias,
    add_options,
    cli_fields,
    from_args,
    non_negative_float,
    non_negative_int,
    option,
    option_values,
    parse_int_list,
    parse_layers,
    positive_int,
)

log = logging.getLogger(__name__)



def _generators() -> list[str]:
    """Generation backends from the generation registry (one list, no copy here)."""
    from attnprobe.generation.factory import backend_kinds

    return backend_kinds()

def port_number(text: str) -> int:
    """argparse type: a TCP port 0-65535 (the one check of ``serve`` and ``app``)."""
    from attnprobe.generation.server.options import port_number as check

    return check(text)


# Why two commands default --queries differently (each --help says it): capture measures seed 002's
# per-step convention, the reasoning start; ``study attention`` reports the decision and the reasoning
# start side by side, so it needs both queries.
QUERIES_WHY = {"reasoning": "seed 002's per-step convention; 'study attention' defaults to reasoning+decision "
                            "because its tables report both positions",
               "reasoning+decision": "its tables report the decision and the reasoning start; 'capture' "
                                     "defaults to reasoning, seed 002's per-step convention"}


def add_dtype_option(group, help: str | None = None) -> None:
    """--dtype alone (``convert``): the model record's field, with the command's own help."""
    from attnprobe.capture.models import ModelOptions

    add_options(group, ModelOptions, ("dtype",), helps={"dtype": help} if help else None)


def add_model_options(p: argparse.ArgumentParser, *, backends: bool = False, device: bool = True,
                      defaults: dict | None = None, helps: dict | None = None):
    """The "model" group, the option fields of :class:`~attnprobe.capture.models.ModelOptions`: --model,
    --dtype, --device; with ``backends`` also the capture backend (--backend) and --tensor-parallel-size
    (vLLM). ``defaults``/``helps``: a command's own default or help (its reason in the help text;
    tests/unit/test_option_defaults.py lists each difference)."""
    from attnprobe.capture.models import ModelOptions

    g = p.add_argument_group("model")
    names = ("model", "dtype") + (("device",) if device else ()) + (("backend", "tensor_parallel_size") if backends else ())
    add_options(g, ModelOptions, names, defaults=defaults, helps=helps)
    return g


# The capture group's options besides --chunk-size (fields of CaptureOptions, which declares them).
CAPTURE_OPTIONS = ("queries", "layers", "rendering", "max_tokens", "truncate", "save_qk_layers", "share_prefixes")


def add_capture_options(p: argparse.ArgumentParser, *, trajectories: bool = True,
                        only: tuple[str, ...] | None = None, queries: str = "reasoning"):
    """The "capture" group, built from :class:`~attnprobe.capture.job.CaptureOptions`: --chunk-size and,
    for trajectory capture, --queries, --layers, --rendering, --max-tokens, --truncate, --save-qk-layers,
    --no-prefix-sharing. ``trajectories=False`` (IBIS, whose query is fixed: the decision token) keeps only
    --chunk-size; ``only`` keeps --chunk-size and the named fields (the counterfactual run chooses its own
    queries); ``queries``: the default of --queries, one of :data:`QUERIES_WHY` (the reason it differs)."""
    from attnprobe.capture.job import CaptureOptions

    g = p.add_argument_group("capture")
    wanted = set(CAPTURE_OPTIONS if only is None else only) if trajectories else set()
    modes = [queries] + [m for m in ("reasoning", "decision", "reasoning+decision") if m != queries]
    add_options(g, CaptureOptions, ("chunk_size",) + tuple(n for n in CAPTURE_OPTIONS if n in wanted),
                defaults={"queries": queries},
                helps={"queries": f"{modes[0]} (default: {QUERIES_WHY[queries]}) | {' | '.join(modes[1:])} "
                                  "| positions:10,20,300"})
    return g


def capture_options(args):
    """The capture group's values (:class:`~attnprobe.capture.job.CaptureOptions`)."""
    from attnprobe.capture.job import CaptureOptions

    return from_args(CaptureOptions, args, save_qk_layers=list(getattr(args, "save_qk_layers", None) or []))


def add_generation_options(p: argparse.ArgumentParser, *, max_new_tokens: int | None, temperature: bool = False,
                           backend_alias: bool = False, max_new_tokens_help: str | None = None,
                           temperature_help: str | None = None):
    """The "generation" group for commands that generate text: the option fields of
    :class:`~attnprobe.generation.factory.GenerationOptions` (``--generator``: in-process transformers or vLLM,
    or an OpenAI-compatible endpoint; when not given, ``openai`` if --base-url is given, else ``transformers``,
    resolved by :func:`finish_args`), then the command's own --max-new-tokens and --temperature (their
    defaults are its study record's: the seeds differ). ``backend_alias`` also accepts the old spelling
    ``--backend`` (hidden)."""
    from attnprobe.generation.factory import GenerationOptions

    g = p.add_argument_group("generation")
    add_options(g, GenerationOptions, ("generator",),
                helps={"generator": cli_fields(GenerationOptions)["generator"].metadata[CLI]["help"]
                       + (" (old name: --backend)" if backend_alias else "")})
    if backend_alias:
        g.add_argument("--backend", dest="generator", choices=_generators(), default=argparse.SUPPRESS,
                       help=argparse.SUPPRESS)
    add_options(g, GenerationOptions, ("base_url", "served_model", "api_key_env", "request_timeout",
                                       "max_reply_bytes", "concurrency"))
    g.add_argument("--max-new-tokens", type=positive_int, default=max_new_tokens,
                   help=max_new_tokens_help or f"generation limit per model call (default {max_new_tokens})")
    if temperature:
        g.add_argument("--temperature", type=non_negative_float, default=None if max_new_tokens is None else 0.0,
                       help=temperature_help or "sampling temperature; 0 = greedy (default)")
    p.set_defaults(_generation=True)
    return g


def add_output_options(p: argparse.ArgumentParser, *, out: bool = True, out_help: str = "output folder",
                       out_required: bool = False, out_default=None, out_type=None, force: bool = True,
                       force_help: str = "redo finished items instead of resuming (skipping) them",
                       progress: bool = True):
    """The "output" group: --out (where results go), --force (redo instead of resume/skip),
    --no-progress (no progress bars). Returns the group so a command can add its own output options."""
    g = p.add_argument_group("output")
    if out:
        kw = {"type": out_type} if out_type else {}
        g.add_argument("--out", required=out_required, default=out_default, help=out_help, **kw)
    if force:
        g.add_argument("--force", action="store_true", help=force_help)
    if progress:
        g.add_argument("--no-progress", action="store_true", help=NO_PROGRESS_HELP)
    return g


@dataclass(frozen=True)
class TrajectoryFiles:
    """The trajectory files a command reads (``capture``, ``counterfactual``, ``study masking``)."""

    trajectories: list[str] = option(flag="trajectories", nargs="+", help="JSONL trajectory files")

NO_PROGRESS_HELP = "no progress bars"


def add_hidden_alias(p: argparse.ArgumentParser, option: str, dest: str, *, new: str, **kw) -> None:
    """An old option name kept working without showing up in --help; using it prints one warning line
    naming ``new``, the spelling to use (:func:`attnprobe.io.options.add_deprecated_alias`)."""
    add_deprecated_alias(p, option, new, dest, **kw)


def generator_kind(args) -> str:
    from attnprobe.generation.factory import GenerationOptions

    return from_args(GenerationOptions, args).kind


def finish_args(args: argparse.Namespace) -> argparse.Namespace:
    """Post-parse fix-ups that depend on several options; raises ValueError (exit code 2) on bad combinations."""
    if getattr(args, "_generation", False):
        args.generator = generator_kind(args)
        if args.generator == "openai":
            if getattr(args, "_served_model_from_model", False) and not args.served_model and args.model != "default":
                log.warning("--model NAME as the endpoint's model name is deprecated; use --served-model NAME")
                args.served_model = args.model
            if not args.base_url:
                raise ValueError("--generator openai needs --base-url (and --served-model)")
    return args


def make_generator(args, **overrides):
    """Open the generation backend the model and generation options describe
    (:meth:`attnprobe.generation.factory.GenerationOptions.open`); ``overrides`` replace single arguments
    (``kind``, ``model``, ``timeout``, ``stop_at_call`` ...)."""
    from attnprobe.capture.models import ModelOptions
    from attnprobe.generation.factory import GenerationOptions

    model = from_args(ModelOptions, args)
    kw = {"model": model.model, "dtype": model.dtype, "device": model.device,
          # the engine options an in-process engine takes (--generator vllm), where the command has them
          "engine": {k: getattr(args, k) for k in ("tensor_parallel_size", "chunk_size")
                     if getattr(args, k, None) is not None}}
    return from_args(GenerationOptions, args).open(**{**kw, **overrides})


# ------------------------------------------------------------------ the cluster group
def add_cluster_options(parser: argparse.ArgumentParser):
    """The "cluster (Ray)" group: --ray [ADDRESS] and the per-replica resources, the option fields of
    :class:`~attnprobe.distributed.cluster.Cluster`."""
    from attnprobe.distributed.cluster import Cluster

    g = parser.add_argument_group("cluster (Ray)")
    add_options(g, Cluster)
    return g


# ------------------------------------------------------------------ options as values
# Built from the parsed arguments once, then passed down: no command reads a Namespace below this.
def model_options(args):
    """The model group's values as the :class:`~attnprobe.capture.models.ModelSpec` to load (the
    capture chunk goes with it: a vLLM engine is built with it)."""
    from attnprobe.capture.models import ModelOptions

    opts = from_args(ModelOptions, args)
    if not hasattr(args, "backend") and getattr(args, "generator", None):  # a command that generates, then
        opts = replace(opts, backend=args.generator)  # captures: in its generator's engine (else transformers)
    return opts.spec(chunk_size=getattr(args, "chunk_size", None))


def cluster_options(args):
    """The :class:`~attnprobe.distributed.cluster.Cluster` the options describe, or None without --ray."""
    if getattr(args, "address", None) is None:  # no --ray
        return None
    from attnprobe.distributed.cluster import Cluster, check_address

    cluster = from_args(Cluster, args)
    check_address(cluster.address)
    return cluster
