"""Policy and setting specs in one canonical spelling: each policy has exactly one accepted string per meaning,
so one setting has one result folder.

Checked here, before any model loads (issue 27): a spec is printable ASCII with no spaces; integers are ASCII
digits written without leading zeros after normalisation (``mask:05`` -> ``mask:5``; ``mask:٣``, ``mask: 2``
refused); ``refine:bm25`` is ``refine:bm25:3``; an ``openai`` refiner needs an http(s) URL; a setting is
``none`` or policies joined by ``+`` with no empty part, no ``none`` part and no part twice. Anything else is
refused in one line naming the spec (its URL's credentials redacted) and what is wrong. This module imports only
:mod:`attnprobe.io.urls` of attnprobe's, so :mod:`attnprobe.agents.policies` and :mod:`attnprobe.agents.context`
can both use it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

from attnprobe.io.urls import redact, url_problem

IRCOT_VARIANTS = ("o", "oq", "oqp")
POLICY_SPECS = ("mask:K", "mask-obs:K", "ircot:o|oq|oqp", "refine:bm25[:N]", "refine:openai:BASE_URL:MODEL",
                "refine-latest:bm25[:N]", "refine-latest:openai:BASE_URL:MODEL")
DEFAULT_BM25_KEEP = 3
# seed 002's masking window: the paper's K = 5 (§3.2), the release's 4 (its run_agent.sh; docs/methods.md, "Masking
# window"). The default policy of `counterfactual`, `study masking` and seed002's settings is the paper's.
PAPER_MASK_WINDOW = 5
DEFAULT_MASK_POLICY = f"mask:{PAPER_MASK_WINDOW}"
_INT = re.compile(r"-?[0-9]{1,9}")  # ASCII digits only: str.isdigit / int() also take '٣' and ' 2'
_PRINTABLE = re.compile(r"[\x21-\x7e]+")  # printable ASCII, no space


def _show(spec: str) -> str:
    """The spec as an error line shows it: credentials redacted, repr, cut to 80 characters (a huge bad value
    stays one short line)."""
    r = repr(redact(spec))
    return r if len(r) <= 80 else r[:77] + "..."


class PolicySpecError(ValueError):
    """A refused policy or setting spec: ``policy 'mask:x': K must be an integer, ...``. The agents layer
    knows no command line; a CLI names its own option with :meth:`for_option` (``--policy``, ``--context-policy``)."""

    def __init__(self, shown: str, what: str, *, sep: str = ": "):
        self.shown, self.what, self.sep = shown, what, sep
        super().__init__(self.for_option("policy"))

    def for_option(self, option: str) -> str:
        """The same line naming ``option`` as the place the spec came from."""
        return f"{option} {self.shown}{self.sep}{self.what}"


def _fail(spec: str, what: str) -> PolicySpecError:
    return PolicySpecError(_show(spec), what)


def _int(fail: Callable[[str], PolicySpecError], value: str, what: str, example: str, least: int) -> int:
    if not _INT.fullmatch(value):
        raise fail(f"{what} must be an integer, e.g. {example}")
    n = int(value)
    if n < least:
        raise fail(f"{what} must be >= {least}")
    return n


def _check_text(spec: str) -> None:
    if not isinstance(spec, str) or not spec:
        raise _fail(str(spec), "empty")
    if not _PRINTABLE.fullmatch(spec):
        bad = next(c for c in spec if not ("\x21" <= c <= "\x7e"))
        what = "a space" if bad.isspace() else f"the non-ASCII or control character {bad!r}"
        raise _fail(spec, f"contains {what}; write it as e.g. mask:5 (ASCII, no spaces)")


def canonical_policy(spec: str, *, setting: str | None = None) -> str:
    """The one spelling of a single policy spec (see the module doc); ValueError naming the spec otherwise
    (``setting``: the whole setting it is a part of, named first, then the part)."""
    def fail(what: str) -> ValueError:
        return _fail(spec, what) if setting is None else _fail(setting, f"the part {_show(spec)}: {what}")

    _check_text(spec)
    kind, _, arg = spec.partition(":")
    if kind == "mask-turns":
        raise fail("mask-turns:K was removed; mask:K now counts turns as seed 002's "
                          "released scaffold does (use mask-obs:K to count observations)")
    if kind in ("mask", "mask-obs"):
        return f"{kind}:{_int(fail, arg, 'K', f'{kind}:5', 0)}"
    if kind == "ircot":
        if arg not in IRCOT_VARIANTS:
            raise fail(f"the IRCoT variant must be one of {', '.join(IRCOT_VARIANTS)}")
        return spec
    if kind in ("refine", "refine-latest"):
        sub, _, rest = arg.partition(":")
        if sub == "bm25":
            n = _int(fail, rest, "N", f"{kind}:bm25:3", 1) if rest else DEFAULT_BM25_KEEP
            return f"{kind}:bm25:{n}"
        if sub == "openai":
            base, _, model = rest.rpartition(":")
            if not base or not model:
                raise fail(f"use {kind}:openai:BASE_URL:MODEL")
            if problem := url_problem(base):
                raise fail(f"BASE_URL {_show(base)} {problem}")
            return spec
        raise fail(f"unknown refiner {sub[:40]!r}; use {kind}:bm25[:N] or {kind}:openai:BASE_URL:MODEL")
    if kind == "none":
        raise fail("'none' takes no argument")
    raise fail(f"unknown policy; use one of {', '.join(POLICY_SPECS)}")


def canonical_setting(spec: str) -> str:
    """The one spelling of a setting: ``none`` or :func:`canonical_policy` parts joined by ``+`` (order kept:
    composed policies apply in order). Refused: an empty part (``+``, ``++``, ``mask:2+``), ``none`` composed
    with a policy, the same part twice, more than one ``refine:`` refiner."""
    _check_text(spec)
    if spec == "none":
        return spec
    parts = spec.split("+")
    if any(not p for p in parts):
        raise _fail(spec, "an empty part (a '+' at the start, at the end or doubled)")
    if "none" in parts:
        raise _fail(spec, "'none' (no policy) cannot be composed with other policies; drop it")
    canon = [canonical_policy(p, setting=spec if len(parts) > 1 else None) for p in parts]
    dup = next((c for i, c in enumerate(canon) if c in canon[:i]), None)
    if dup is not None:
        raise _fail(spec, f"{dup} appears twice")
    if sum(c.startswith("refine:") for c in canon) > 1:
        raise _fail(spec, "at most one refine:... per setting")
    return "+".join(canon)


def canonical_settings(specs: Iterable[str]) -> list[str]:
    """:func:`canonical_setting` of each; two specs that mean the same setting (``mask:5`` and ``mask:05``)
    are refused, naming both, since they would run one setting twice under two folder names."""
    out: dict[str, str] = {}
    for s in specs:
        c = canonical_setting(s)
        if c in out:
            raise PolicySpecError(_show(s), f"is the same setting as {_show(out[c])} ({c}); give it once", sep=" ")
        out[c] = s
    return list(out)
