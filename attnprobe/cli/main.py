"""The ``attnprobe`` command line. Each feature module registers its own subcommand.

Exit codes scripts can trust: 0 success; 1 some items failed (the rest were written);
2 bad input or usage, or an output that cannot be written (read-only, disk full); 3 model not
available locally; 130 interrupted. Whatever fails, stderr gets one line ``attnprobe: error: ...``
(:func:`main` is the one place that turns exceptions into it), at most :data:`MAX_ERROR_CHARS` long;
``-v`` adds the traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import errno
import importlib
import importlib.util
import json
import logging
import os
import re
import shutil
import sys
import textwrap

from attnprobe.errors import AttnprobeError, ModelNotFoundError

EXIT_OK, EXIT_PARTIAL, EXIT_INPUT, EXIT_MODEL, EXIT_INTERRUPT = 0, 1, 2, 3, 130

log = logging.getLogger("attnprobe.cli")

# Modules with a register(subparsers) function; each adds one or more subcommands.
SUBCOMMAND_MODULES = [
    "attnprobe.cli.capture",  # capture, demo
    "attnprobe.cli.report",  # report
    "attnprobe.cli.importer",  # import
    "attnprobe.cli.serve",  # serve
    "attnprobe.cli.convert",  # convert (GGUF -> HF folder for vLLM)
    "attnprobe.cli.ibis",  # ibis, compare
    "attnprobe.cli.run",  # run
    "attnprobe.cli.app",  # app
    "attnprobe.cli.counterfactual",  # counterfactual
    "attnprobe.cli.study",  # study masking
]

# The module that registers each command: `attnprobe COMMAND ...` imports only that one (its --help loads
# no other command's option records); the bare `attnprobe` and an unknown command import them all.
COMMAND_MODULES = {
    "capture": "attnprobe.cli.capture", "demo": "attnprobe.cli.capture", "report": "attnprobe.cli.report",
    "import": "attnprobe.cli.importer", "serve": "attnprobe.cli.serve", "convert": "attnprobe.cli.convert",
    "ibis": "attnprobe.cli.ibis", "compare": "attnprobe.cli.ibis", "run": "attnprobe.cli.run",
    "app": "attnprobe.cli.app", "counterfactual": "attnprobe.cli.counterfactual", "study": "attnprobe.cli.study",
}

# How `attnprobe --help` groups the commands; a command not listed here shows under "other".
COMMAND_GROUPS = [
    ("attention in recorded trajectories", ["capture", "report", "demo", "counterfactual"]),
    ("studies (generate, then capture)", ["run", "ibis", "compare", "study"]),
    ("trajectories and models", ["import", "convert", "serve"]),
    ("explore", ["app"]),
]

EXIT_CODES = ("Exit codes: 0 ok, 1 some items failed (the rest were written), 2 bad input or an output that\n"
              "cannot be written (read-only, disk full), 3 model not available locally, 130 interrupted\n"
              "(finished results are kept; rerun to resume).")


# The papers the help texts cite as "seed NNN" (section numbers such as "E.5" are theirs: seed 002's
# appendix E.5); docs/methods.md quotes each definition with its section.
SEEDS = {
    "000": "From Inertia to Objectivity: Improving Deep Research Agents with Noise Isolation (IBIS, NIS-Agent)",
    "001": "From Inertia to Objectivity: Improving Deep Research Agents with Noise Isolation (its full text: "
           "IBIS's framings and reminders)",
    "002": "Masking Stale Observations Helps Search Agents -- Until It Doesn't: A Regime Map and Its Mechanism "
           "(arXiv 2606.00408)",
    "004": "Mitigating Context Interference for Reliable and Efficient Search Agents (arXiv 2608.10743)",
}
_SEED_REF = re.compile(r"\bseeds? (00\d)(?:/(00\d))?")


def seeds_note(text: str) -> str:
    """The lines naming each paper ``text`` cites as "seed NNN" ('' when it cites none)."""
    cited = sorted({n for m in _SEED_REF.finditer(" ".join(text.split())) for n in m.groups() if n in SEEDS})
    if not cited:
        return ""
    width = max(60, min(100, shutil.get_terminal_size((80, 24)).columns)) - 2
    lines = textwrap.wrap("'seed NNN' cites a paper attnprobe reproduces, and a section after it is that paper's "
                          "('seed 002 E.5': its appendix E.5); docs/methods.md quotes each definition:", width)
    for n in cited:
        lines.extend(textwrap.wrap(SEEDS[n], width, initial_indent=f"  seed {n}: ", subsequent_indent=" " * 12))
    return "\n".join(lines)


MAX_ERROR_CHARS = 400
"""No error line is longer than this, whatever the input (a huge bad value is cut with an ellipsis)."""
VALUE_CHARS = 160  # a log line's long value (an item, an error) is cut to this, so the line keeps every part


def shorten(text: str, limit: int = MAX_ERROR_CHARS) -> str:
    """``text`` on one line, with its URLs' credentials redacted (:func:`attnprobe.io.urls.redact`), in at most
    ``limit`` characters: a longer one keeps its start (the file, line and field) and its end (what to do), and
    says how much of the middle was cut."""
    from attnprobe.io.urls import redact

    text = redact(" ".join(str(text).split()))
    if len(text) <= limit:
        return text
    keep = max(limit - len(f" [... {len(text)} characters cut ...] "), 0)
    head = keep * 2 // 3
    mark = f" [... {len(text) - keep} characters cut ...] "
    return (text[:head] + mark + text[len(text) - (keep - head):] if keep > head else text[:head] + mark)[:limit]


def error_line(prefix: str, text: str) -> str:
    """``prefix`` + ``text`` in at most :data:`MAX_ERROR_CHARS` characters (:func:`shorten`): every error line the
    CLI prints, whole."""
    return prefix + shorten(text, MAX_ERROR_CHARS - len(prefix))


class _Lines(logging.Formatter):
    """``attnprobe: <message>`` bounded as every error line is (:func:`error_line`; per-item ``failed:`` lines
    included); debug messages (``-v``) and tracebacks are kept whole, credentials redacted."""

    def format(self, record: logging.LogRecord) -> str:
        from attnprobe.io.urls import redact

        if record.levelno > logging.DEBUG and isinstance(record.args, tuple):  # each long value cut in its middle
            record = copy.copy(record)  # other handlers see the record as logged
            record.args = tuple(a if isinstance(a, (int, float)) or len(str(a)) <= VALUE_CHARS
                                else shorten(str(a), VALUE_CHARS) for a in record.args)
        msg = record.getMessage()
        line = error_line("attnprobe: ", msg) if record.levelno > logging.DEBUG else "attnprobe: " + redact(msg)
        if record.exc_info:
            line += "\n" + redact(self.formatException(record.exc_info))
        return line


class Parser(argparse.ArgumentParser):
    """argparse with its usage errors cut to :data:`MAX_ERROR_CHARS` (argparse repeats the bad value); a help
    that cites a seed paper ends with its title (:func:`seeds_note`)."""

    def error(self, message: str):
        super().error(shorten(message, MAX_ERROR_CHARS - len(f"{self.prog}: error: ")))

    def format_help(self) -> str:
        text = super().format_help()
        note = seeds_note(text)
        return f"{text}\n{note}\n" if note else text


_ROLE = re.compile(r":(?:func|class|mod|meth|data|attr|obj):`~?([^`]+)`")


def plain_text(text: str | None) -> str | None:
    """A docstring as ``--help`` shows it: reST roles become their name and double backticks go (module
    docstrings serve as command descriptions; a user reads the help as plain text)."""
    if not text:
        return text
    return _ROLE.sub(lambda m: m.group(1), text).replace("``", "'")


class CommandParser(Parser):
    """Parser of every subcommand (nested ones too): also accepts -v/-q after the command name; its
    description and epilog are shown as plain text (:func:`plain_text`)."""

    def __init__(self, *args, **kwargs):
        for key in ("description", "epilog"):
            kwargs[key] = plain_text(kwargs.get(key))
        super().__init__(*args, **kwargs)
        g = self.add_argument_group("global options (also accepted before the command)")
        # Own dests with no default, so they never overwrite -v/-q given before the command.
        g.add_argument("-v", "--verbose", dest="sub_verbose", action="count", default=argparse.SUPPRESS,
                       help="more detail (debug messages; also tracebacks on errors)")
        g.add_argument("-q", "--quiet", dest="sub_quiet", action="store_true", default=argparse.SUPPRESS,
                       help="only warnings and errors (no progress bars)")


def _command_listing(helps: dict[str, str]) -> str:
    width = max(60, min(100, shutil.get_terminal_size((80, 24)).columns)) - 2
    name_w = max(len(n) for n in helps) + 2
    listed = {n for _, names in COMMAND_GROUPS for n in names}
    groups = [(title, [n for n in names if n in helps]) for title, names in COMMAND_GROUPS]
    groups.append(("other", [n for n in helps if n not in listed]))
    lines = []
    for title, names in groups:
        if not names:
            continue
        lines.append(f"{title}:")
        for n in names:
            lines.extend(textwrap.wrap(helps[n], width, initial_indent=f"  {n:<{name_w}}",
                                       subsequent_indent=" " * (name_w + 2)))
        lines.append("")
    lines.append("'attnprobe COMMAND --help' explains a command and lists its options.")
    return "\n".join(lines)


def command_of(argv: list[str]) -> str | None:
    """The command ``argv`` names: its first word that is not an option (the global options take no value)."""
    return next((a for a in argv if not a.startswith("-")), None)


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The whole command line; given the arguments about to be parsed, only the module of the command they
    name is imported (:data:`COMMAND_MODULES`), so ``attnprobe COMMAND --help`` stays fast."""
    parser = Parser(
        prog="attnprobe", usage="%(prog)s [-h] [--version] [-v] [-q] COMMAND ...",
        formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EXIT_CODES)
    from attnprobe._version import __version__

    parser.add_argument("--version", action="version", version=f"attnprobe {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="more detail (-v: debug messages; also tracebacks on errors)")
    parser.add_argument("-q", "--quiet", action="store_true", help="only warnings and errors (no progress bars)")
    sub = Commands(parser.add_subparsers(dest="command", metavar="COMMAND", prog="attnprobe",
                                         parser_class=CommandParser))
    command = command_of(argv) if argv is not None else None
    modules = [COMMAND_MODULES[command]] if command in COMMAND_MODULES else SUBCOMMAND_MODULES
    for name in modules:
        if importlib.util.find_spec(name.rsplit(".", 1)[0]) is not None and importlib.util.find_spec(name) is None:
            continue  # feature module not present in this build
        importlib.import_module(name).register(sub)
    helps = sub.helps
    parser.description = ("Exact attention by turn and role inside LLM search-agent trajectories.\n\n"
                          + _command_listing(helps))
    sub.action.help = argparse.SUPPRESS  # the grouped listing above replaces argparse's flat one
    return parser


class Commands:
    """What each module's ``register`` gets: argparse's subparsers action, recording every command's
    one-line help for the grouped listing (argparse keeps its own copy private)."""

    def __init__(self, action):
        self.action = action
        self.helps: dict[str, str] = {}

    def add_parser(self, name: str, **kwargs) -> argparse.ArgumentParser:
        self.helps[name] = kwargs.get("help") or ""
        return self.action.add_parser(name, **kwargs)


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is *now* (not the stream at setup time), so a caller that
    swaps stderr (notebooks, test capture) never gets "I/O operation on closed file"."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:
        pass


@contextlib.contextmanager
def library_bars(off: bool):
    """--no-progress / -q also mean no bars from the libraries under us (the GGUF de-quantization bar
    of a model load, which the transformers backend ties to the hub's switch): the hub's environment
    switch is set for the command's duration only (tests run many commands in one process)."""
    if not off:
        yield
        return
    old = os.environ.get("HF_HUB_DISABLE_PROGRESS_BARS")
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("HF_HUB_DISABLE_PROGRESS_BARS", None)
        else:
            os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = old


def setup_logging(verbose: int = 0, quiet: bool = False) -> None:
    """Messages of every attnprobe module go to stderr as ``attnprobe: ...`` (progress bars stay tqdm)."""
    level = logging.WARNING if quiet else logging.DEBUG if verbose else logging.INFO
    handler = _StderrHandler()
    handler.setFormatter(_Lines())
    for name in ("attnprobe", "attnprobe_hooks", "attnprobe_app"):
        lg = logging.getLogger(name)
        lg.handlers[:] = [handler]
        lg.setLevel(level)
        lg.propagate = False


def describe_error(exc: BaseException) -> str:
    """The one-line text of an expected failure: the file (and line/field) where there is one."""
    if isinstance(exc, OSError) and not isinstance(exc, AttnprobeError):
        reason = {errno.ENOSPC: "no space left on device (disk full)", errno.EDQUOT: "disk quota exceeded",
                  errno.EROFS: "read-only file system", errno.EACCES: "permission denied",
                  errno.EISDIR: "is a folder, not a file", errno.ENOTDIR: "a file is in the way of a folder"
                  }.get(exc.errno, exc.strerror or str(exc) or type(exc).__name__)
        where = " -> ".join(str(f) for f in (exc.filename, exc.filename2) if f is not None)
        return f"{where}: {reason}" if where else reason
    if isinstance(exc, json.JSONDecodeError):
        return f"invalid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})"
    if isinstance(exc, UnicodeDecodeError):
        return f"input is not UTF-8 text (byte {exc.start})"
    if isinstance(exc, RecursionError):
        return "input nested too deeply (JSON or messages)"
    text = " ".join(str(exc).split())
    if isinstance(exc, (AttnprobeError, ValueError)) or (isinstance(exc, FileNotFoundError) and text):
        return text or type(exc).__name__
    return f"unexpected {type(exc).__name__}: {text}" if text else f"unexpected {type(exc).__name__}"


def main(argv: list[str] | None = None) -> int:
    """Run one command. The only error boundary of the CLI: every failure becomes one line
    ``attnprobe: error: ...`` on stderr and an exit code (see EXIT_CODES); ``-v`` adds the traceback."""
    from attnprobe.cli.options import finish_args
    from attnprobe.io.options import deprecation_warnings

    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    verbose = args.verbose + getattr(args, "sub_verbose", 0)
    quiet = args.quiet or getattr(args, "sub_quiet", False)
    setup_logging(verbose, quiet)
    for line in deprecation_warnings(args):  # an old spelling of an option: one line each
        log.warning(line)
    if quiet and hasattr(args, "no_progress"):
        args.no_progress = True  # -q: only warnings and errors, no progress bars either
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_INPUT
    try:
        finish_args(args)
        log.debug("command %s: %s", args.command,
                  {k: v for k, v in sorted(vars(args).items()) if k != "func" and not k.startswith("_")})
        with library_bars(getattr(args, "no_progress", False) or quiet):
            return int(args.func(args) or 0)
    except ModelNotFoundError as exc:
        log.debug("traceback", exc_info=True)
        print(error_line("attnprobe: model not available: ", describe_error(exc)), file=sys.stderr)
        return EXIT_MODEL
    except KeyboardInterrupt:
        log.debug("traceback", exc_info=True)
        print("attnprobe: interrupted; finished results are kept, rerun to resume", file=sys.stderr)
        return EXIT_INTERRUPT
    except Exception as exc:  # noqa: BLE001 - the boundary: everything else is one line + exit code 2
        log.debug("traceback", exc_info=True)
        hint = "" if verbose or isinstance(exc, (AttnprobeError, OSError, ValueError)) else " (-v shows the traceback)"
        print(error_line("attnprobe: error: ", _policy_option(exc, args) or describe_error(exc) + hint),
              file=sys.stderr)
        return EXIT_INPUT


def _policy_option(exc: BaseException, args) -> str | None:
    """A refused policy spec named by the option it came from: the command's ``policy_option`` (``run``:
    ``--context-policy``), else ``--policy``; the agents layer that refused it knows no options."""
    from attnprobe.agents.policy_specs import PolicySpecError

    if not isinstance(exc, PolicySpecError):
        return None
    return " ".join(exc.for_option(getattr(args, "policy_option", "--policy")).split())


if __name__ == "__main__":
    sys.exit(main())
