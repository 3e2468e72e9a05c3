"""``attnprobe study interference``: run the seeds' agents with context policies in the loop, side by side;
``attnprobe study attention``: the attention side of the same runs (captures and counterfactuals).

One question set, one scaffold (``ircot``: seed 004's IRCoT with tags; ``seed002``: seed 002's
search/open/find agent), several settings (``--policy``, repeatable; ``none`` is the baseline), every
(setting, question) a work item of :class:`attnprobe.studies.loop.job.InterferenceJob` on the local or the
Ray executor. Resumable: finished items are skipped (``--force`` redoes them). Writes OUT/study.md and
OUT/study.json (docs/loop.md).
"""

from __future__ import annotations

import argparse
import logging
import sys
import textwrap
from pathlib import Path

from attnprobe.agents.policy_specs import DEFAULT_MASK_POLICY
from attnprobe.cli.options import (
    add_capture_options,
    add_cluster_options,
    add_generation_options,
    add_hidden_alias,
    add_model_options,
    add_options,
    add_output_options,
    cluster_free,
    from_args,
    non_negative_int,
    positive_int,
)

log = logging.getLogger(__name__)

EPILOG = """\
Examples:
  attnprobe study interference trajectories/questions_loop.jsonl --scaffold ircot \\
      --policy none --policy ircot:o --policy ircot:oq --policy ircot:oqp --policy refine:bm25:3 --out runs/ircot
  attnprobe study interference q.jsonl --scaffold seed002 --policy none --policy mask:5 --policy mask-obs:5 \\
      --out runs/masking --generator openai --base-url http://127.0.0.1:8000/v1 --served-model my-model
  attnprobe study interference q.jsonl --scaffold seed002 --generation-preset cpu --policy none --policy mask:1 --out runs/cpu
  attnprobe capture runs/ircot/ircot-oq/calls.jsonl --out runs/ircot/captures   # the recorded calls, as sent

Settings: none | mask:K | mask-obs:K | ircot:o|oq|oqp | refine:bm25[:N] | refine:openai:URL:MODEL,
joined with '+' (e.g. ircot:oq+refine:bm25:3). mask:K is seed 002's released rule: successful results older
than the K-th most recent turn with a non-error call become "[Auto-archived browser result] tool=... | args:
..."; mask-obs:K keeps the K most recent observations instead. The refiner runs once per round on that
round's documents. seed002 generates as seed 002's appendix C does (8192 tokens, temperature 1.0);
--generation-preset cpu (128 tokens, greedy) keeps the bundled model usable on a CPU.
Questions: JSONL with question/Question/query and golden_answers/answers/answer/Answer (NQ, HotpotQA, 2Wiki,
MuSiQue, Bamboogle, FlashRAG, BrowseComp-Plus).
"""


def register(studies) -> None:
    """Add ``interference`` to the ``study`` subcommands."""
    from attnprobe.studies.loop.agents import PRESETS, LoopConfig

    p = studies.add_parser("interference", help="seeds 002/004: agents with context policies in the loop, "
                                                "settings side by side (EM, ART, tokens, fixed/broken)",
                           description=textwrap.fill(__doc__.split("\n\n")[1], 100), epilog=EPILOG,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("questions", help="JSONL question set (default fields: question, golden_answers / answer)")
    g = p.add_argument_group("study")
    add_options(g, LoopConfig, ("scaffold", "ircot_form"))
    g.add_argument("--policy", "--context-policy", dest="policies", action="append", metavar="SETTING",
                   help="a setting to run; repeat it for more settings, side by side; compose policies within one "
                        "setting with + (e.g. ircot:oq+refine:bm25:3); default: none plus the scaffold's seed "
                        "settings")
    g.add_argument("--baseline", default=None, help="the setting the others are compared with (default: the first)")
    add_options(g, LoopConfig, ("max_turns", "top_k", "open_lines", "judge", "search", "corpus"))
    g.add_argument("--limit", type=positive_int, help="only the first N questions")
    g.add_argument("--bootstrap", type=positive_int, default=2000, help="bootstrap resamples for CIs (default 2000)")
    g.add_argument("--episodes-per-batch", dest="batch_size", type=positive_int, default=None, metavar="N",
                   help="episodes (setting x question) in flight, stepped together: one batched model call per "
                        "turn; records do not depend on it (default 1, or --concurrency N with --generator openai)")
    add_hidden_alias(p, "--batch-size", "batch_size", new="--episodes-per-batch", type=positive_int)
    g.add_argument("--capture-in-loop", action="store_true",
                   help="capture every recorded call's attention from the agent's own forward passes while it "
                        "generates (the decision in the call's prefill, the reasoning start at the decode step that "
                        "feeds it; --queries and --layers as 'study attention'), written where 'study attention' "
                        "writes its captures, which then prefills nothing for them (docs/loop.md, 'Captured in the "
                        "loop'). In process only (--generator transformers): a served model (--generator openai) "
                        "returns text, not its attention, so its calls are captured afterwards by 'study attention'")
    add_options(g, LoopConfig, ("structured_actions",))
    add_model_options(p)
    add_options(g, LoopConfig, ("preset",))
    add_hidden_alias(p, "--preset", "preset", new="--generation-preset", choices=tuple(PRESETS))
    add_generation_options(p, max_new_tokens=None, temperature=True,
                           max_new_tokens_help="generation limit per model call (default: seed002 8192, seed 002 "
                                               "appendix C; ircot 128, ours: seed 004 gives none; "
                                               "--generation-preset cpu 128; 'run' uses 4096, seed 000 C.3, the runner's seed)",
                           temperature_help="sampling temperature, 0 = greedy (default: seed002 1.0, seed 002 "
                                            "appendix C; ircot 0; --generation-preset cpu 0)")
    from attnprobe.capture.job import CaptureOptions

    add_options(p.add_argument_group("capture in the loop (--capture-in-loop)"), CaptureOptions, ("queries", "layers"),
                defaults={"queries": "reasoning+decision"},
                helps={"queries": "reasoning+decision (default, as 'study attention') | reasoning | decision"})
    add_cluster_options(p)
    add_output_options(p, out_required=True,
                       out_help=f"study folder (one subfolder per setting, {_names()['study_md']})")
    p.set_defaults(func=cmd_interference)
    _register_attention(studies)


DEFAULT_SETTINGS = {"ircot": ["none", "ircot:o", "ircot:oq", "ircot:oqp", "refine:bm25:3"],
                    "seed002": ["none", DEFAULT_MASK_POLICY]}


def _executor(args):
    """Generation where the options say: an endpoint's client here (--generator openai; --ray refused), else
    the model options' executor, which chats with the model in process."""
    from attnprobe.cli.options import executor, make_generator

    stop = False if args.scaffold == "seed002" else None  # parallel calls: do not stop at the first one

    def load():
        return make_generator(args, timeout=600.0, stop_at_call=stop)

    if args.generator == "openai":
        from attnprobe.execution.local import LocalExecutor

        cluster_free(args, "--generator openai generates through the endpoint, which already serves many requests")
        return LocalExecutor(load, progress=not args.no_progress)
    return executor(args, load=load)


def model_label(args) -> str:
    """What generates, as results are stamped with it: the endpoint's served model, or the model
    path with its dtype (a changed one is refused on rerun unless --force)."""
    if args.generator == "openai":
        return f"openai:{args.served_model or args.model}"  # the same model behind another URL is the same
    return f"{args.generator}:{args.model}:{getattr(args, 'dtype', None)}"


def batch_size(args) -> int:
    """Episodes in flight: --batch-size, else --concurrency N with --generator openai (N requests in flight
    need N episodes), else 1 (one episode after another)."""
    if args.batch_size is not None:
        return args.batch_size
    if args.generator == "openai":
        return max(1, int(getattr(args, "concurrency", None) or 1))
    return 1


def in_loop_options(args):
    """``--capture-in-loop``'s :class:`~attnprobe.studies.loop.in_loop.InLoopOptions` (None when off): the
    capture options and the model as ``study attention`` will record them. Refused in one line with a served
    generator (it returns no attention) and with explicit query positions."""
    if not args.capture_in_loop:
        return None
    if args.generator != "transformers":
        raise ValueError(f"--capture-in-loop needs the generator in process (--generator transformers); "
                         f"--generator {args.generator} returns text, not attention: run 'study attention' afterwards")
    from attnprobe.capture.job import CaptureOptions
    from attnprobe.studies.loop.in_loop import InLoopOptions

    capture = from_args(CaptureOptions, args)
    if not isinstance(capture.queries, str):
        raise ValueError("--capture-in-loop takes --queries reasoning, decision or reasoning+decision, not positions")
    return InLoopOptions.of(capture, args.model, getattr(args, "dtype", None) or "float32")


def cmd_interference(args) -> int:
    from attnprobe.agents.policy_specs import canonical_setting, canonical_settings
    from attnprobe.agents.questions import read_questions
    from attnprobe.agents.search import make_search
    from attnprobe.io import hold_dir_lock
    from attnprobe.studies.loop.agents import LoopConfig
    from attnprobe.studies.loop.context import parse_setting
    from attnprobe.studies.loop.layout import StudyLayout
    from attnprobe.studies.loop.scoring import Scorer
    from attnprobe.studies.loop.study import run_study

    # one spelling per setting (mask:05 is mask:5), so one folder; exit 2 on a bad one, before anything loads
    settings = canonical_settings(args.policies or DEFAULT_SETTINGS[args.scaffold])
    for s in settings:
        parse_setting(s)
    if args.baseline:
        args.baseline = canonical_setting(args.baseline)
    if args.baseline and args.baseline not in settings:
        raise ValueError(f"--baseline {args.baseline!r} is not one of the settings ({', '.join(settings)})")
    Scorer(args.judge)  # a bad --judge fails here
    questions = read_questions(args.questions)[: args.limit]
    config = from_args(LoopConfig, args, max_tokens=args.max_new_tokens, temperature=args.temperature)
    if config.stream and args.generator == "openai":  # a chat endpoint takes messages, not token ids
        raise ValueError("--ircot-form stream (the ircot default: Search-R1's one token sequence) runs in process "
                         "(--generator transformers or vllm); against a served model use --ircot-form chat")
    make_search(args.search, args.corpus)  # a missing corpus or key fails before the model loads
    in_loop = in_loop_options(args)
    with hold_dir_lock(Path(args.out), "study folder"), _executor(args) as ex:  # one run per study folder
        counts, study = run_study(ex, Path(args.out), questions, settings, config, baseline=args.baseline,
                                  force=args.force, n_boot=args.bootstrap, model=model_label(args),
                                  batch_size=batch_size(args), in_loop=in_loop)
    study_md = StudyLayout(Path(args.out)).study_md
    print(study_md.read_text(encoding="utf-8"))
    from attnprobe.execution.counts import RunCounts

    counts = RunCounts.of(counts)
    print(counts.line("study interference", to=study_md), file=sys.stderr)
    return counts.exit_code


ATTENTION_EPILOG = """\
Examples:
  attnprobe study interference q.jsonl --scaffold seed002 --policy none --policy mask:5 --out runs/masking
  attnprobe study attention runs/masking            # captures + counterfactuals; study.md gets the section
  attnprobe study attention runs/masking --layers full --ray auto
  attnprobe study attention runs/served --model /models/Qwen2.5-7B-Instruct   # a served study's local weights
  attnprobe report runs/masking/mask-5/capture      # or the app, on any OUT/<setting>/capture

Writes OUT/<setting>/{capture}/ (attnprobe capture's format), OUT/<setting>/{counterfactual}/ (attnprobe
counterfactual's), OUT/{attention_json}, OUT/{attention_md}, and the attention section of OUT/{study_md}.
"""


def _names() -> dict[str, str]:
    """The study folder's file names (:mod:`attnprobe.studies.loop.layout`), for the help texts."""
    from attnprobe.studies.loop import layout as L

    return {"capture": L.CAPTURE, "counterfactual": L.COUNTERFACTUAL, "attention_json": L.ATTENTION_JSON,
            "attention_md": L.ATTENTION_MD, "study_md": L.STUDY_MD}


def _register_attention(studies) -> None:
    n = _names()
    p = studies.add_parser(
        "attention", help="the attention side of an interference study: capture every recorded call, "
                          "counterfactuals at the baseline's steps, one report",
        description="Capture every recorded call of every setting of an interference study folder (OUT/<setting>/"
                    f"{n['capture']}/, queries reasoning+decision unless --queries), run each other setting's context "
                    f"policy as a counterfactual on the baseline's full histories (OUT/<setting>/{n['counterfactual']}/), "
                    "and write the attention shares per setting at the decision (the token before each reply) "
                    "and the reasoning start (steps with >= --shares-min-past past turns, and per step), the "
                    "per-token shares relative to uniform and the paired differences with the baseline, with "
                    f"bootstrap CIs over questions, to OUT/{n['attention_md']}, {n['attention_json']} and the study's "
                    f"{n['study_md']}. Resumable (finished captures and steps are "
                    "skipped; --force redoes them). A folder that is not a study is exit code 2. The capture model "
                    "is the study's own (its weights and dtype; for a served model its name when that is local "
                    "weights, else refused: give them with --model); another --model is named with the agent's in "
                    "every output ('capture model X, agent model Y').",
        epilog=ATTENTION_EPILOG.format(**n), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", metavar="OUT", help="the study folder (--out of 'attnprobe study interference')")
    g = p.add_argument_group("study")
    g.add_argument("--only-setting", dest="policies", action="append", metavar="SETTING",
                   help="only this setting of the study (repeatable; default: every setting)")
    add_hidden_alias(p, "--policy", "policies", new="--only-setting", action="append", metavar="SETTING")
    g.add_argument("--min-past", type=non_negative_int, default=None,
                   help="counterfactual steps with at least this many past turns (default per policy, as "
                        "'attnprobe counterfactual': K+1 for mask:K and mask-obs:K, 2 for IRCoT, 1 for refiners)")
    g.add_argument("--shares-min-past", type=non_negative_int, default=None, metavar="N",
                   help="the share tables use calls with at least N past turns in the agent's run (default "
                        "5: seed 002 E.5, 'using only reasoning steps with at least five past "
                        "turns'; fewer when the study's turn limit allows fewer: 4 for ircot's --max-turns 4); "
                        "first calls and, at the reasoning start, tool-call-only replies are always left "
                        "out (0 keeps first calls); the per-step table shows every step")
    g.add_argument("--bootstrap", type=positive_int, default=2000, help="bootstrap resamples for CIs (default 2000)")
    from attnprobe.capture.models import MODEL_HELP
    from attnprobe.model_files import dtype_help

    add_model_options(p, backends=True, defaults={"model": None, "dtype": None}, helps={  # the study's own (capture_model.py)
        "model": "capture model (default: the study's own; required for a served model whose weights are not local). "
                 "Another model is labelled 'capture model X, agent model Y' in every output. " + MODEL_HELP,
        "dtype": dtype_help("the study's, else float32", "the attention read is the agent's own only in its dtype")})
    add_capture_options(p, queries="reasoning+decision")
    add_cluster_options(p)
    add_output_options(p, out=False, force_help="redo finished captures and counterfactual steps")
    p.set_defaults(func=cmd_attention)


def cmd_attention(args) -> int:
    from attnprobe.agents.policy_specs import canonical_settings
    from attnprobe.cli.options import capture_options, executor, model_options
    from attnprobe.counterfactual.run import RunOptions
    from attnprobe.io import hold_dir_lock
    from attnprobe.studies.loop.attention import read_study, run_attention
    from attnprobe.studies.loop.capture_model import choose_capture_model
    from attnprobe.studies.loop.layout import StudyLayout

    out = Path(args.out)
    if args.policies:
        try:
            args.policies = canonical_settings(args.policies)  # the spelling the study folder uses
        except ValueError as exc:  # the policy parser names --policy, this command's option is --only-setting
            raise ValueError(str(exc).replace("--policy ", "--only-setting ", 1)) from None
    read_study(out)  # exit 2 for a folder that is not a study, before any model loads
    opts = from_args(RunOptions, args, progress=not args.no_progress)  # the capture group's fields
    with hold_dir_lock(out, "study folder"):  # not while the study itself runs
        choice = choose_capture_model(out, args.model)  # the study's weights, or refused in one line
        args.model, args.dtype = choice.spec, args.dtype or choice.dtype or "float32"
        if choice.differs:
            log.warning("study attention: %s: the attention is another model's reading of the agent's contexts, "
                        "and every output says so", choice.label)
        with executor(args) as ex:
            counts, doc = run_attention(ex, out, model=model_options(args), capture=capture_options(args),
                                        counterfactual=opts, min_past=args.min_past,
                                        shares_min_past=args.shares_min_past, force=args.force,
                                        n_boot=args.bootstrap, only=args.policies, models=choice)
    attention_md = StudyLayout(out).attention_md
    print(attention_md.read_text(encoding="utf-8"))
    cf_failed = sum(d.get("counterfactual", {}).get("counts", {}).get("failed", 0) for d in doc["settings"].values())
    print(f"study attention: {counts['done']} calls captured, {counts['done_before']} already done, "
          f"{counts['failed']} failed; {cf_failed} counterfactual steps failed -> {attention_md}",
          file=sys.stderr)
    return 1 if counts["failed"] or cf_failed else 0
