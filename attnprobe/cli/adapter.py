"""The one CLI adapter between a command's parsed options and a study: which executor runs it
(:func:`open_executor`, the only place in ``attnprobe.cli`` that asks for one), and how a study's
:class:`~attnprobe.execution.study.Outcome` becomes output and an exit code (:func:`run_command`).

Why one place: the endpoint case (``--generator openai``: the client runs in this process, the endpoint
serves the requests, ``--ray`` is refused) used to be copied into three commands, each with its own
branching on the cluster option; here it is decided once, and commands never look at ``--ray`` themselves.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable
from typing import Any

from attnprobe.cli.options import cluster_options, make_generator, model_options

ENDPOINT_REASON = "--generator openai generates through the endpoint, which already serves many requests"
# A Ray replica builds its chat from the model spec (Job.needs "chat"), not from this process's vLLM engine that
# generates and captures in one pass, so the in-loop capture would not run there: refused, not silently lost.
VLLM_IN_LOOP_REASON = ("--generator vllm --capture-in-loop runs one in-process vLLM engine that generates and "
                       "captures; run it without --ray, or capture afterwards with 'study attention --ray'")


def open_executor(args, *, generate: bool = False, endpoint_refuses_ray: str | None = ENDPOINT_REASON,
                  load: Callable[[], Any] | None = None, **generator: Any):
    """The executor the options ask for (:func:`attnprobe.distributed.open_executor` chooses the kind):

    - ``generate=False``: the model options' model, loaded in this process or on Ray replicas (``--ray``);
    - ``generate=True``: a chat from the generation options (``make_generator(args, **generator)``, e.g.
      ``timeout``, ``stop_at_call``), in this process or on Ray replicas of the model; with ``--generator
      openai`` always here (the endpoint serves the requests), and ``--ray`` refused with
      ``endpoint_refuses_ray`` (None: ignored for generation, as ``ibis all``, whose capture still runs on
      the cluster); ``load``: the command's own way to open that chat (default: the generation options').
    A run with nothing left to do loads nothing (loading waits for the first job)."""
    from attnprobe.distributed.executors import open_executor as choose
    from attnprobe.distributed.executors import refuse_cluster

    cluster = cluster_options(args)
    progress = not getattr(args, "no_progress", False)
    if not generate:
        model = model_options(args)
        return choose(model.load, cluster=cluster, model=model, progress=progress)

    if load is None:
        def load():
            return make_generator(args, **generator)

    if args.generator == "vllm" and generator.get("capture"):
        refuse_cluster(cluster, VLLM_IN_LOOP_REASON)
    if args.generator == "openai":
        if endpoint_refuses_ray:
            refuse_cluster(cluster, endpoint_refuses_ray)
        return choose(load, progress=progress)
    return choose(load, cluster=cluster, model=model_options(args), progress=progress)  # replicas: the model's spec


class ExecutorPair:
    """Two executors opened as one, for a study whose jobs need a chat and a model from different places
    (``ibis all --generator openai``: the endpoint's client generates, the in-process model captures): a job
    runs on ``chat_executor`` when it ``needs`` a chat, else on ``model_executor``."""

    def __init__(self, chat_executor, model_executor):
        self.chat_executor, self.model_executor = chat_executor, model_executor
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> ExecutorPair:
        self.chat_executor = self._stack.enter_context(self.chat_executor)
        self.model_executor = self._stack.enter_context(self.model_executor)
        return self

    def __exit__(self, *exc) -> None:
        self._stack.__exit__(*exc)

    @property
    def shards(self) -> bool:
        return bool(getattr(self.chat_executor, "shards", False) or getattr(self.model_executor, "shards", False))

    def run(self, job) -> dict[str, int]:
        return (self.chat_executor if getattr(job, "needs", "model") == "chat" else self.model_executor).run(job)


def open_pair(args, **generator: Any) -> ExecutorPair:
    """:class:`ExecutorPair` of the generation options' chat (``open_executor(args, generate=True, ...)``; with
    an endpoint, --ray is left to the model's side) and the model options' model."""
    return ExecutorPair(open_executor(args, generate=True, endpoint_refuses_ray=None, **generator),
                        open_executor(args))


def run_command(study, options, args, *, pair: bool = False, **executor: Any) -> int:
    """Run ``study`` with ``options`` through the one driver (:func:`attnprobe.execution.study.run_study`)
    on :func:`open_executor`'s executor (``executor``: its keywords; ``pair``: :func:`open_pair`'s); prints
    the outcome's lines on stdout and its notes on stderr; returns its exit code."""
    from attnprobe.execution.study import run_study

    outcome = run_study(study, options, lambda: (open_pair if pair else open_executor)(args, **executor))
    for line in outcome.lines:
        print(line)
    for line in outcome.notes:
        print(line, file=sys.stderr)
    return outcome.exit_code
