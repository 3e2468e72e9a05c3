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
import textwrap
from pathlib import Path

from attnprobe.cli.options import (
    add_capture_options,
    add_cluster_options,
    add_generation_options,
    add_hidden_alias,
    add_model_options,
    add_options,
    add_output_options,
    from_args,
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
    from attnprobe.studies.loop.study import InterferenceOptions

    add_options(p, InterferenceOptions, ("questions_file",))
    g = p.add_argument_group("study")
    add_options(g, LoopConfig, ("scaffold", "ircot_form"))
    add_options(g, InterferenceOptions, ("settings", "baseline"))
    add_options(g, LoopConfig, ("max_turns", "top_k", "open_lines", "judge", "search", "corpus"))
    add_options(g, InterferenceOptions, ("limit", "n_boot", "batch_size"))
    add_hidden_alias(p, "--batch-size", "batch_size", new="--episodes-per-batch", type=positive_int)
    add_options(g, InterferenceOptions, ("capture_in_loop",))
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
    if args.generator not in ("transformers", "vllm"):
        raise ValueError(f"--capture-in-loop needs the generator in process (--generator transformers or vllm); "
                         f"--generator {args.generator} returns text, not attention: run 'study attention' afterwards")
    from attnprobe.capture.job import CaptureOptions
    from attnprobe.studies.loop.in_loop import InLoopOptions

    capture = from_args(CaptureOptions, args)
    if not isinstance(capture.queries, str):
        raise ValueError("--capture-in-loop takes --queries reasoning, decision or reasoning+decision, not positions")
    return InLoopOptions.of(capture, args.model, getattr(args, "dtype", None) or "float32", backend=args.generator)


def interference_options(args):
    """The study's options record (:class:`~attnprobe.studies.loop.study.InterferenceOptions`)."""
    from attnprobe.agents.context import parse_setting, parse_settings
    from attnprobe.studies.loop.agents import LoopConfig
    from attnprobe.studies.loop.study import InterferenceOptions

    config = from_args(LoopConfig, args, max_new_tokens=args.max_new_tokens, temperature=args.temperature)
    # the settings parsed here, at the edge, and carried as values (a bad one: one line naming --policy, exit 2)
    settings = parse_settings(args.settings) if args.settings else None
    baseline = parse_setting(args.baseline) if args.baseline else None
    return from_args(InterferenceOptions, args, out=Path(args.out), config=config, settings=settings, baseline=baseline,
                     questions_file=Path(args.questions_file), force=args.force, model=model_label(args),
                     batch_size=batch_size(args), endpoint=args.generator == "openai", in_loop=in_loop_options(args))


def cmd_interference(args) -> int:
    from attnprobe.cli.adapter import run_command
    from attnprobe.studies.loop.study import INTERFERENCE

    return run_command(INTERFERENCE, interference_options(args), args, generate=True, timeout=600.0,
                       stop_at_call=False if args.scaffold == "seed002" else None,  # seed002: parallel calls
                       capture=bool(args.capture_in_loop))  # vllm: one engine that generates and captures


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
    from attnprobe.studies.loop.attention_study import AttentionOptions

    add_options(p, AttentionOptions, ("out",))
    g = p.add_argument_group("study")
    add_options(g, AttentionOptions, ("only",))
    add_hidden_alias(p, "--policy", "only", new="--only-setting", action="append", metavar="SETTING")
    add_options(g, AttentionOptions, ("min_past", "shares_min_past", "n_boot"))
    from attnprobe.capture.models import MODEL_HELP
    from attnprobe.model_files import dtype_help

    add_model_options(p, backends=True, defaults={"model": None, "dtype": None}, helps={  # the study's own (capture_model.py)
        "model": "capture model (default: the study's own; required for a served model whose weights are not local). "
                 "Another model is labelled 'capture model X, agent model Y' in every output. " + MODEL_HELP,
        "dtype": dtype_help("the study's, else float32", "the attention read is the agent's own only in its dtype")})
    add_capture_options(p, queries="reasoning+decision")
    add_cluster_options(p)
    add_output_options(p, out=False, force_help="redo finished captures and counterfactual steps")
    p.set_defaults(func=cmd_attention, policy_option="--only-setting")  # how a refused setting is named


def attention_options(args):
    """The attention side's options record (:class:`~attnprobe.studies.loop.attention_study.AttentionOptions`),
    with the capture model chosen from the study folder (its weights and dtype; another --model is
    labelled in every output); exit 2 for a folder that is not a study, before any model loads."""
    from attnprobe.agents.context import parse_settings
    from attnprobe.cli.options import capture_options, model_options
    from attnprobe.counterfactual.run import RunOptions
    from attnprobe.io import hold_dir_lock
    from attnprobe.studies.loop.attention import read_study
    from attnprobe.studies.loop.attention_study import AttentionOptions
    from attnprobe.studies.loop.capture_model import choose_capture_model

    out = Path(args.out)
    if args.only:
        args.only = parse_settings(args.only)  # parsed here, at the edge (a bad one is named --only-setting)
    read_study(out)  # exit 2 for a folder that is not a study, before any model loads
    with hold_dir_lock(out, "study folder"):  # not while the study itself runs (the run locks it again)
        choice = choose_capture_model(out, args.model)  # the study's weights, or refused in one line
    args.model, args.dtype = choice.spec, args.dtype or choice.dtype or "float32"
    if choice.differs:
        log.warning("study attention: %s: the attention is another model's reading of the agent's contexts, "
                    "and every output says so", choice.label)
    return from_args(AttentionOptions, args, out=out, model=model_options(args), capture=capture_options(args),
                     counterfactual=from_args(RunOptions, args, progress=not args.no_progress), force=args.force,
                     models=choice)


def cmd_attention(args) -> int:
    from attnprobe.cli.adapter import run_command
    from attnprobe.studies.loop.attention_study import ATTENTION

    return run_command(ATTENTION, attention_options(args), args)
