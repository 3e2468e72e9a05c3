"""``attnprobe run``: the NIS-Agent runner over a JSONL of questions."""

from __future__ import annotations

import argparse
import logging
import textwrap

from attnprobe.agents.recorder import RUNNER_MAX_NEW_TOKENS
from attnprobe.cli.options import (
    add_cluster_options,
    add_generation_options,
    add_hidden_alias,
    add_model_options,
    add_options,
    add_output_options,
    option_values,
    positive_int,
)
from attnprobe.errors import AttnprobeError
from attnprobe.studies.runner.config import RunCommandOptions, RunSettings

log = logging.getLogger(__name__)

EPILOG = """\
Examples:
  attnprobe run trajectories/questions.jsonl --preset baseline --out runs/baseline.jsonl
  attnprobe run trajectories/questions.jsonl --preset nis-agent --out runs/nis.jsonl   # rerun: continues it
  attnprobe run q.jsonl --preset baseline --out runs/baseline.jsonl --ray --batch-size 4   # Ray replicas
  attnprobe run q.jsonl --filter in-context --validation stage1 --out runs/ablation.jsonl
  attnprobe run q.jsonl --preset baseline --context-policy mask:5 --out runs/masked.jsonl
  attnprobe run q.jsonl --context-policy ircot:oq+refine:bm25:3 --out runs/refined.jsonl
  OPENAI_API_KEY=... attnprobe run q.jsonl --generator openai --base-url http://127.0.0.1:8000/v1 \\
      --served-model my-model --out runs/x.jsonl
  ATTNPROBE_SEARCH_KEY=... attnprobe run q.jsonl --search http --out runs/web.jsonl

Attention: capture OUT afterwards (attnprobe capture OUT --out DIR); unlike 'study interference', the runner
does not capture in the loop (docs/loop.md, "Captured in the loop", says why).
Outputs: OUT (every model call as a trajectory; capture works on it), OUT with .results.ndjson (one
line per finished question) and .summary.json (accuracy and average tokens per question); with a
context policy also .history.jsonl (each search worker's full history, which its calls link to).
Resume: a run continues what OUT holds (finished questions skipped, a half-run question replays its
recorded calls); other settings are refused; --force starts again. Exit code 1 if a question failed.
Questions: JSON Lines read as 'study interference' reads them: question/Question/query and
golden_answers/answers/answer/Answer (+ aliases); without gold answers accuracy is null (warned).
"""


def register(sub) -> None:
    p = sub.add_parser("run", help="run the NIS-Agent manager/worker agents over questions, recording every call",
                       description=textwrap.fill(
                           "Run the NIS-Agent runner (manager + search worker, context-isolated filter, "
                           "isolation-based stepwise validation) over a JSONL of questions. Every model call is "
                           "appended atomically as a trajectory; rerunning continues after a crash.", 100),
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_options(p, RunCommandOptions, ("questions",))
    g = p.add_argument_group("agent")
    add_options(g, RunCommandOptions, ("preset", "filter", "validation", "name", "search", "corpus"))
    add_options(g, RunSettings, ("manager_steps", "worker_steps", "max_rewrites", "validation_extra_steps",
                                 "max_validation_steps"))
    add_options(g, RunCommandOptions, ("limit", "context_policy"))
    add_options(g, RunSettings, ("final_check", "structured_actions"))
    add_options(g, RunCommandOptions, ("batch_size",))
    add_hidden_alias(p, "--batch-size", "batch_size", new="--questions-per-batch", type=positive_int)
    add_model_options(p)
    add_generation_options(p, max_new_tokens=RUNNER_MAX_NEW_TOKENS, temperature=True,
                           max_new_tokens_help=f"generation limit per model call (default {RUNNER_MAX_NEW_TOKENS}: "
                                               "seed 000 C.3's limit for non-reasoning models, the runner's seed; "
                                               "'study interference' follows its scaffold's seed instead)")
    # old spelling `--base-url URL --model NAME`: NAME is the served model (with a deprecation warning)
    p.set_defaults(_served_model_from_model=True)
    add_cluster_options(p)
    g = add_output_options(p, out_required=True, out_help="output JSONL of recorded calls (trajectories)",
                           force_help="start over: delete OUT and its results first (old name: --overwrite)")
    add_options(g, RunCommandOptions, ("resume",))
    add_hidden_alias(p, "--overwrite", "force", new="--force", action="store_true")
    p.set_defaults(func=cmd_run, policy_option="--context-policy")  # how a refused policy spec is named


def setting_name(base: str, setting) -> str:
    """The default run name: the preset (or ``custom``) and the context policy (a parsed setting), so the table
    and run ids label a run by its whole setting (``baseline_mask-1``, not ``baseline`` under mask:1); safe in ids."""
    if not setting.active:
        return base
    import re

    return f"{base}_" + "_".join(re.sub(r"[^A-Za-z0-9.-]+", "-", p) for p in setting.parts)


def make_chat(args):
    """The generation backend (attnprobe.generation.factory.open_backend): in process, generation
    stops at a complete call of an offered tool; over --base-url, any OpenAI-compatible endpoint."""
    from attnprobe.cli.options import make_generator

    return make_generator(args)


def runner_options(args):
    """The run's options record (:class:`~attnprobe.studies.runner.job.RunnerOptions`); the questions read and
    the search backend checked (a missing corpus or key fails before the model loads)."""
    from attnprobe.agents.context import NO_SETTING, parse_setting
    from attnprobe.agents.questions import read_questions
    from attnprobe.agents.search import shared_search
    from attnprobe.studies.runner.job import RunnerOptions

    if args.resume and args.force:
        raise AttnprobeError("--resume and --force exclude each other")
    if args.resume:
        log.warning("--resume is deprecated: a run continues OUT by default (--force starts again)")
    overrides = {k: v for k, v in (("filter", args.filter), ("validation", args.validation)) if v}
    # the context policy parsed here, at the edge, and carried as a value (a bad one: one line naming
    # --context-policy, exit 2, before the questions are read or a model loads)
    setting = parse_setting(args.context_policy) if args.context_policy else NO_SETTING
    options = option_values(RunSettings, args)
    if not options["final_check"]:
        del options["final_check"]  # not given: the preset's value
    settings = RunSettings.preset(
        args.preset, **overrides, **options, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
        context_policy=setting,
        name=args.name or setting_name(args.preset if not overrides else "custom", setting))
    if args.questions is None:
        from attnprobe.resources import data_path

        args.questions = str(data_path("questions.jsonl"))
    questions = read_questions(args.questions)
    if args.limit:
        questions = questions[: args.limit]
    # a missing corpus or key fails before the model loads; the job uses this process's index (replicas
    # build their own), so it is built once
    shared_search(args.search, args.corpus)
    return RunnerOptions(questions, settings, args.out, search_kind=args.search, corpus=args.corpus,
                         force=args.force, batch_size=args.batch_size)


def cmd_run(args) -> int:
    from attnprobe.cli.adapter import run_command
    from attnprobe.studies.runner.job import RUNNER

    # the study checks the output (writable, not in use, records made with these settings) under its lock
    # before the executor loads a model
    return run_command(RUNNER, runner_options(args), args, generate=True, load=lambda: make_chat(args))
