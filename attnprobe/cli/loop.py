"""``attnprobe study interference``: run the seeds' agents with context policies in the loop, side by side.

One question set, one scaffold (``ircot``: seed 004's IRCoT with tags; ``seed002``: seed 002's
search/open/find agent), several settings (``--policy``, repeatable; ``none`` is the baseline), every
(setting, question) a work item of :class:`attnprobe.studies.loop.job.InterferenceJob` on the local or the
Ray executor. Resumable: finished items are skipped (``--force`` redoes them). Writes OUT/study.md and
OUT/study.json (docs/loop.md).
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from pathlib import Path

from attnprobe.cli.options import (
    add_cluster_options,
    add_generation_options,
    add_model_options,
    add_output_options,
    cluster_free,
    positive_int,
)

EPILOG = """\
Examples:
  attnprobe study interference trajectories/questions_loop.jsonl --scaffold ircot \\
      --policy none --policy ircot:o --policy ircot:oq --policy ircot:oqp --policy refine:bm25:3 --out runs/ircot
  attnprobe study interference q.jsonl --scaffold seed002 --policy none --policy mask:5 --policy mask-turns:2 \\
      --out runs/masking --generator openai --base-url http://127.0.0.1:8000/v1 --served-model my-model
  attnprobe capture runs/ircot/ircot-oq/calls.jsonl --out runs/ircot/captures   # the recorded calls, as sent

Settings: none | mask:K | mask-turns:K | ircot:o|oq|oqp | refine:bm25[:N] | refine:openai:URL:MODEL,
joined with '+' (e.g. ircot:oq+refine:bm25:3). The refiner runs once per round on that round's documents.
Questions: JSONL with question/Question/query and golden_answers/answers/answer/Answer (NQ, HotpotQA, 2Wiki,
MuSiQue, Bamboogle, FlashRAG, BrowseComp-Plus).
"""


def register(studies) -> None:
    """Add ``interference`` to the ``study`` subcommands."""
    p = studies.add_parser("interference", help="seeds 002/004: agents with context policies in the loop, "
                                                "settings side by side (EM, ART, tokens, fixed/broken)",
                           description=textwrap.fill(__doc__.split("\n\n")[1], 100), epilog=EPILOG,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("questions", help="JSONL question set (default fields: question, golden_answers / answer)")
    g = p.add_argument_group("study")
    g.add_argument("--scaffold", choices=("ircot", "seed002"), default="ircot",
                   help="ircot: seed 004's tag agent (default); seed002: seed 002's search/open/find agent")
    g.add_argument("--policy", "--context-policy", dest="policies", action="append", metavar="SETTING",
                   help="a setting to run (repeatable; default: none plus the scaffold's seed settings)")
    g.add_argument("--baseline", default=None, help="the setting the others are compared with (default: the first)")
    g.add_argument("--max-turns", type=positive_int, default=None,
                   help="model calls per question before giving up (default: ircot 4, seed002 10)")
    g.add_argument("--top-k", type=positive_int, default=None,
                   help="passages (ircot, default 3) or results (seed002, default 15) per search")
    g.add_argument("--open-lines", type=positive_int, default=50, help="seed002: lines 'open' shows (default 50)")
    g.add_argument("--judge", default="exact",
                   help="exact (offline EM, default) or openai:BASE_URL:MODEL (seed 002's F.5 LLM judge)")
    g.add_argument("--search", choices=("bm25", "http"), default="bm25",
                   help="bm25 = the offline corpus (default); http = a web search API (ATTNPROBE_SEARCH_*)")
    g.add_argument("--corpus", help="JSONL corpus for bm25 (default: trajectories/corpus/docs.jsonl)")
    g.add_argument("--limit", type=positive_int, help="only the first N questions")
    g.add_argument("--bootstrap", type=positive_int, default=2000, help="bootstrap resamples for CIs (default 2000)")
    add_model_options(p)
    add_generation_options(p, max_new_tokens=128, temperature=True)
    add_cluster_options(p)
    add_output_options(p, out_required=True, out_help="study folder (one subfolder per setting, study.md)")
    p.set_defaults(func=cmd_interference)


DEFAULT_SETTINGS = {"ircot": ["none", "ircot:o", "ircot:oq", "ircot:oqp", "refine:bm25:3"],
                    "seed002": ["none", "mask:5"]}


def _executor(args):
    """Generation where the options say: an endpoint's client here (--generator openai; --ray refused), else
    the model options' executor, which chats with the model in process."""
    from attnprobe.cli.options import executor, make_generator

    stop = False if args.scaffold == "seed002" else None  # parallel calls: do not stop at the first one

    def load():
        return make_generator(args, timeout=600.0, stop_at_call=stop)

    if args.backend == "openai":
        from attnprobe.execution.local import LocalExecutor

        cluster_free(args, "--generator openai generates through the endpoint, which already serves many requests")
        return LocalExecutor(load, progress=not args.no_progress)
    return executor(args, load=load)


def cmd_interference(args) -> int:
    from attnprobe.agents.search import make_search
    from attnprobe.studies.loop.agents import LoopConfig
    from attnprobe.studies.loop.context import parse_setting
    from attnprobe.studies.loop.questions import read_questions
    from attnprobe.studies.loop.scoring import Scorer
    from attnprobe.studies.loop.study import run_study

    settings = list(dict.fromkeys(args.policies or DEFAULT_SETTINGS[args.scaffold]))
    for s in settings:
        parse_setting(s)  # exit 2 on a bad setting, before anything is loaded
    if args.baseline and args.baseline not in settings:
        raise ValueError(f"--baseline {args.baseline!r} is not one of the settings ({', '.join(settings)})")
    Scorer(args.judge)  # a bad --judge fails here
    questions = read_questions(args.questions)[: args.limit]
    config = LoopConfig(scaffold=args.scaffold, max_turns=args.max_turns, top_k=args.top_k,
                        open_lines=args.open_lines, max_tokens=args.max_new_tokens, temperature=args.temperature,
                        judge=args.judge, search=args.search, corpus=args.corpus)
    make_search(args.search, args.corpus)  # a missing corpus or key fails before the model loads
    with _executor(args) as ex:
        counts, study = run_study(ex, Path(args.out), questions, settings, config, baseline=args.baseline,
                                  force=args.force, n_boot=args.bootstrap)
    print((Path(args.out) / "study.md").read_text(encoding="utf-8"))
    print(f"study interference: {counts['done']} run, {counts['done_before']} already done, {counts['failed']} "
          f"failed -> {Path(args.out) / 'study.md'}", file=sys.stderr)
    return 1 if counts["failed"] else 0
