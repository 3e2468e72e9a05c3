"""The ``attnprobe`` command line. Each feature module registers its own subcommand.

Exit codes scripts can trust: 0 success; 1 some items failed (the rest were written);
2 bad input or usage; 3 model not available locally; 130 interrupted.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import logging
import sys

from attnprobe.errors import AttnprobeError, ModelNotFoundError

EXIT_OK, EXIT_PARTIAL, EXIT_INPUT, EXIT_MODEL, EXIT_INTERRUPT = 0, 1, 2, 3, 130

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
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="attnprobe",
        description="Exact attention by turn and role inside LLM search-agent trajectories.",
        epilog="Exit codes: 0 ok, 1 some items failed, 2 bad input, 3 model not available locally, 130 interrupted.",
    )
    from attnprobe._version import __version__

    parser.add_argument("--version", action="version", version=f"attnprobe {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="more detail (-v: debug messages; also tracebacks on errors)")
    parser.add_argument("-q", "--quiet", action="store_true", help="only warnings and errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMAND_MODULES:
        if importlib.util.find_spec(name.rsplit(".", 1)[0]) is not None and importlib.util.find_spec(name) is None:
            continue  # feature module not present in this build
        importlib.import_module(name).register(sub)
    return parser


def setup_logging(verbose: int = 0, quiet: bool = False) -> None:
    """Messages of every attnprobe module go to stderr as ``attnprobe: ...`` (progress bars stay tqdm)."""
    level = logging.WARNING if quiet else logging.DEBUG if verbose else logging.INFO
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("attnprobe: %(message)s"))
    for name in ("attnprobe", "attnprobe_hooks", "attnprobe_app"):
        lg = logging.getLogger(name)
        lg.handlers[:] = [handler]
        lg.setLevel(level)
        lg.propagate = False


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    setup_logging(args.verbose, args.quiet)
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_INPUT
    try:
        return int(args.func(args) or 0)
    except ModelNotFoundError as exc:
        print(f"attnprobe: model not available: {exc}", file=sys.stderr)
        return EXIT_MODEL
    except (AttnprobeError, ValueError, FileNotFoundError) as exc:
        print(f"attnprobe: error: {exc}", file=sys.stderr)
        return EXIT_INPUT
    except KeyboardInterrupt:
        print("attnprobe: interrupted; finished results are kept, rerun to resume", file=sys.stderr)
        return EXIT_INTERRUPT


if __name__ == "__main__":
    sys.exit(main())
