"""Options declared once, on the record that carries them (in the manner of inseq's ``cli_arg`` fields).

A record (a dataclass: ``CaptureOptions``, ``RunOptions``, ...) declares each of its command-line options
with :func:`option`: the field's default is the option's one default, and its ``metadata`` holds the flag,
help, type, choices and action. :func:`add_options` adds a record's fields to an argparse group and
:func:`from_args` builds the record from the parsed arguments, so no option is declared, defaulted or
negated twice. It lives in ``attnprobe.io`` (the lowest layer) so records in every layer can use it.

The argparse types the records need (:func:`positive_int`, :func:`parse_int_list`, ...) live here too.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import re
from typing import Any

CLI = "attnprobe.cli"  # the metadata key


def option(default: Any = dataclasses.MISSING, *, flag: str, help: str, default_factory: Any = dataclasses.MISSING,
           **argparse_kw) -> Any:
    """A dataclass field that is also a command-line option. ``help`` may name ``{default}``;
    ``argparse_kw`` (type, choices, action, metavar, nargs; ``aliases``: more spellings of the flag, shown
    beside it) go to ``add_argument``; a ``flag`` without
    dashes is a positional argument (the field's name is its dest, the flag what --help shows). A negated flag
    (``--no-x`` for ``x: bool = True``) is ``action="store_false"``: the one place it is negated."""
    meta = {CLI: {"flag": flag, "help": help, **argparse_kw}}
    if default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def same_as(record: type, name: str) -> Any:
    """A field declared like ``record``'s field ``name`` (same default, flag and help): one option
    that two records carry (the counterfactual run's rendering is the capture's)."""
    f = next(f for f in dataclasses.fields(record) if f.name == name)
    if f.default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=f.default_factory, metadata=f.metadata)
    return dataclasses.field(default=f.default, metadata=f.metadata)


def cli_fields(record) -> dict[str, dataclasses.Field]:
    """The fields of ``record`` (a dataclass or an instance) that are options, by name (= argparse dest)."""
    return {f.name: f for f in dataclasses.fields(record) if CLI in f.metadata}


def option_flags(record) -> dict[str, str]:
    """How each option field of ``record`` is spelled on the command line (for messages), by field name."""
    return {n: f.metadata[CLI]["flag"] for n, f in cli_fields(record).items()}


def field_default(f: dataclasses.Field) -> Any:
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def add_options(group, record: type, names: tuple[str, ...] | None = None, *,
                defaults: dict[str, Any] | None = None, helps: dict[str, str] | None = None) -> None:
    """Add ``record``'s option fields (all, or ``names`` in that order) to ``group``. ``defaults``
    replaces a field's default for this command only (a difference the caller declares with its
    reason, and that ``tests/unit/test_option_defaults.py`` lists); ``helps`` replaces a help text."""
    fields = cli_fields(record)
    for name in names or tuple(fields):
        meta = dict(fields[name].metadata[CLI])
        default = (defaults or {}).get(name, field_default(fields[name]))
        flag, text = meta.pop("flag"), (helps or {}).get(name, meta.pop("help"))
        meta.pop("help", None)
        aliases = meta.pop("aliases", ())  # other spellings shown beside the flag
        if meta.get("action") not in ("store_true", "store_false"):
            if default is not dataclasses.MISSING:  # a required option or positional has none
                meta["default"] = default
        elif default != (meta["action"] == "store_false"):
            raise ValueError(f"{record.__name__}.{name}: a flag's default is fixed by its action")
        if flag.startswith("-"):
            action = group.add_argument(flag, *aliases, dest=name, help=text.format(default=default), **meta)
        else:  # a positional argument: its field's name is the dest, its flag what --help shows
            if meta.get("nargs") not in ("?", "*"):
                meta.pop("default", None)  # a required positional has no default
            action = group.add_argument(name, metavar=meta.pop("metavar", flag), help=text.format(default=default),
                                        **meta)
        action.option_of = (record, name)  # which field declared it (tests/unit/test_option_defaults.py)


def from_args(record: type, args: argparse.Namespace, **extra):
    """``record`` built from the parsed ``args``: every option field the command declared (the others
    keep the record's default), then ``extra`` (values that are not options, or are derived)."""
    return record(**{**option_values(record, args), **extra})


def option_values(record: type, args: argparse.Namespace) -> dict[str, Any]:
    """The values of ``record``'s option fields that the command declared, by field name."""
    return {n: getattr(args, n) for n in cli_fields(record) if hasattr(args, n)}


class OnceAction(argparse.Action):
    """An option that names one setting: given twice it is refused in one line (a repeated option
    elsewhere means separate settings, never a composition; compose with ``A+B``)."""

    def __call__(self, parser, namespace, values, option_string=None):
        old = getattr(namespace, self.dest, None)
        if old is not None and old != self.default:
            raise argparse.ArgumentError(self, f"given twice ({old}, {values}): this command runs one setting; "
                                               f"compose policies with '+', e.g. {option_string} {old}+{values}")
        setattr(namespace, self.dest, values)


DEPRECATED = "_deprecated"  # the namespace attribute listing the warning lines of old spellings used


def add_deprecated_alias(parser, old: str, new: str, dest: str, **argparse_kw) -> None:
    """``old`` kept working as another spelling of the option ``new`` (same ``dest``), hidden from --help;
    using it adds one warning line to the parsed namespace (:func:`deprecation_warnings`; the command's
    main prints each once). ``argparse_kw``: the action, type or metavar the old spelling takes."""
    base = parser._registry_get("action", argparse_kw.pop("action", None), None)  # argparse's class for it

    class Deprecated(base):
        def __call__(self, p, namespace, values, option_string=None):
            super().__call__(p, namespace, values, option_string)
            line = f"{option_string} is deprecated here; use {new} (same meaning)"
            seen = getattr(namespace, DEPRECATED, [])
            if line not in seen:
                setattr(namespace, DEPRECATED, [*seen, line])

    parser.add_argument(old, dest=dest, default=argparse.SUPPRESS, help=argparse.SUPPRESS, action=Deprecated,
                        **argparse_kw)


def deprecation_warnings(args: argparse.Namespace) -> list[str]:
    """The warning lines of the deprecated spellings ``args`` was parsed from (one per spelling)."""
    return list(getattr(args, DEPRECATED, []))


# ------------------------------------------------------------------ argparse types
def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1 (refused while parsing, before any model is loaded)."""
    v = _int(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {v}")
    return v


def non_negative_int(text: str) -> int:
    """argparse type: an integer >= 0 (step and rewrite budgets, where 0 means none)."""
    v = _int(text)
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {v}")
    return v


def non_negative_float(text: str) -> float:
    """argparse type: a finite number >= 0 (temperatures: 'nan' and 'inf' are refused while parsing,
    so they never reach a results file, where a NaN would fail every later resume)."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(v) or v < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text!r}")
    return v


def positive_seconds(text: str) -> float:
    """argparse type: a finite number of seconds > 0 (timeouts)."""
    v = non_negative_float(text)
    if v <= 0:
        raise argparse.ArgumentTypeError(f"must be more than 0 seconds, got {text!r}")
    return v


MAX_LIST_ITEMS = 1 << 20  # an integer list (layers, positions) may name at most this many values
_DIGITS = re.compile(r"\s*[0-9]{1,18}\s*")


def parse_int_list(text: str | None) -> list[int] | None:
    """'0,3,5-8' -> [0, 3, 5, 6, 7, 8]; None/'all' -> None.

    Values must be >= 0 and ranges ascending; the size of every range is checked before it is expanded,
    so '0-1000000000' is refused at once (more than :data:`MAX_LIST_ITEMS` values) instead of filling
    memory. Whether the values fit the model (its layer count, the prompt length) is checked later."""
    if text is None or text == "all":
        return None
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        a, sep, b = part.partition("-")
        if not _DIGITS.fullmatch(a) or (sep and not _DIGITS.fullmatch(b)):
            raise argparse.ArgumentTypeError(f"not a list of integers >= 0 or ranges a-b: {text!r} (at {part!r})")
        lo, hi = int(a), int(b) if sep else int(a)
        if hi < lo:
            raise argparse.ArgumentTypeError(f"range {part!r} runs backwards (write {hi}-{lo})")
        if len(out) + (hi - lo + 1) > MAX_LIST_ITEMS:
            raise argparse.ArgumentTypeError(f"{text!r} names more than {MAX_LIST_ITEMS} values")
        out.extend(range(lo, hi + 1))
    return out


def parse_layers(text: str | None):
    """--layers: ``all`` (None: every layer), ``full`` (the full-attention layers of a hybrid model,
    seed 002 E.1; every layer of a model without a mix) or a list of integers (:func:`parse_int_list`)."""
    return "full" if text == "full" else parse_int_list(text)


def parse_queries(text: str):
    """--queries: a mode name, or ``positions:10,20,300``."""
    if text.startswith("positions:"):
        return parse_int_list(text.split(":", 1)[1])
    return text
