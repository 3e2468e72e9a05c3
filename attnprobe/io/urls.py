"""Endpoint URLs: the one check (scheme, host, port) of every URL a command sends requests to (``--base-url``,
``--judge openai:URL:MODEL``, ``refine:openai:URL:MODEL``), made while the arguments are parsed, before any model
loads or any call is made; and the one redaction of the credentials a URL may carry (``http://user:pw@host``),
applied wherever a spec or URL is written or printed (error lines, log lines, errors.jsonl, study.md)."""

from __future__ import annotations

import argparse
import re
from urllib.parse import urlsplit

SCHEMES = ("http", "https")
EXAMPLE = "http://127.0.0.1:8000/v1"
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.\-]*://)[^/\s@?#\"<>{}\[\]\\|^`]+@")  # RFC 3986 userinfo
_SPACE = re.compile(r"[\s\x00-\x1f\x7f]")


def redact(text: str) -> str:
    """``text`` with the credentials of every URL in it (``scheme://user:pw@``) written as ``scheme://***@``."""
    return _USERINFO.sub(r"\1***@", str(text))


def url_problem(url: str) -> str | None:
    """What is wrong with ``url`` as an endpoint (an http:// or https:// URL with a host and, if given, a port
    1-65535), or None."""
    if _SPACE.search(url):
        return "contains a space or a control character"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:  # a port that is not a number or out of range, a bad IPv6 host
        return f"is not a valid URL ({exc})"
    if parts.scheme.lower() not in SCHEMES:
        return f"must be an http:// or https:// URL, e.g. {EXAMPLE}"
    if not parts.hostname:
        return f"names no host, e.g. {EXAMPLE}"
    if port == 0:
        return "port must be 1-65535, not 0"
    return None


def show_url(url: str, limit: int = 80) -> str:
    """A URL as an error line quotes it: credentials redacted, repr, at most ``limit`` characters."""
    r = repr(redact(url))
    return r if len(r) <= limit else r[: limit - 3] + "..."


def check_url(url: str, what: str) -> str:
    """``url`` when it is a valid endpoint (:func:`url_problem`), else ValueError ``"<what>: URL <problem>"``."""
    problem = url_problem(url)
    if problem:
        raise ValueError(f"{what}: {show_url(url)} {problem}")
    return url


def http_url(text: str) -> str:
    """argparse type of ``--base-url``: an endpoint URL (:func:`url_problem`), refused while parsing."""
    problem = url_problem(text)
    if problem:
        raise argparse.ArgumentTypeError(f"{show_url(text)} {problem}")
    return text
