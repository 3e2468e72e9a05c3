"""The command-line face of the server: its option group (shared by ``attnprobe serve`` and
``python -m attnprobe.generation.server``), the limits built from it, and the module's ``main``."""

from __future__ import annotations

import argparse
import os
import sys

from attnprobe.errors import AttnprobeError
from attnprobe.generation.server.launcher import serve
from attnprobe.generation.server.protocol import (
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_QUEUE,
    DEFAULT_READ_TIMEOUT,
    DEFAULT_REQUEST_TIMEOUT,
    Limits,
)
from attnprobe.io.options import add_deprecated_alias, deprecation_warnings
from attnprobe.model_files import DTYPES, canonical_dtype


def add_server_options(p: argparse.ArgumentParser, *, default_port: int):
    """The "server" option group of ``attnprobe serve`` and ``python -m attnprobe.generation.server``."""
    g = p.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default 127.0.0.1, loopback only; any other prints a warning)")
    g.add_argument("--port", type=port_number, default=default_port, help=f"port (default {default_port}; 0 = any free port)")
    g.add_argument("--require-key-env", dest="api_key_env", default=None, metavar="NAME",
                   help="require 'Authorization: Bearer <key>' with the key read from environment variable NAME "
                        "(default: no authentication; the clients' --api-key-env names the key they send)")
    add_deprecated_alias(p, "--api-key-env", "--require-key-env", "api_key_env", metavar="NAME")
    g.add_argument("--max-prompt-tokens", type=int, default=None,
                   help="refuse longer prompts with HTTP 400 (default: the model's context length)")
    g.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES,
                   help=f"refuse larger request bodies with HTTP 413 before reading them (default {DEFAULT_MAX_BODY_BYTES})")
    g.add_argument("--read-timeout", type=float, default=DEFAULT_READ_TIMEOUT,
                   help=f"seconds a socket read may wait before the connection is dropped (default {DEFAULT_READ_TIMEOUT:g})")
    g.add_argument("--receive-timeout", dest="request_timeout", type=float, default=DEFAULT_REQUEST_TIMEOUT,
                   metavar="SECONDS",
                   help="seconds to receive a whole request (line, headers, body) before answering HTTP 408 "
                        f"(default {DEFAULT_REQUEST_TIMEOUT:g}; the clients' --request-timeout is how long they wait "
                        "for a reply)")
    add_deprecated_alias(p, "--request-timeout", "--receive-timeout", "request_timeout", type=float)
    g.add_argument("--max-seconds", type=float, default=None,
                   help="stop a generation that runs longer and answer HTTP 503 (default: no limit)")
    g.add_argument("--max-queue", type=int, default=DEFAULT_MAX_QUEUE,
                   help="requests generating or waiting their turn; more are answered HTTP 503 with Retry-After "
                        f"(default {DEFAULT_MAX_QUEUE})")
    return g


def port_number(text: str) -> int:
    """argparse type: a TCP port 0-65535 (checked before the model loads)."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 0 <= v <= 65535:
        raise argparse.ArgumentTypeError(f"port must be 0-65535, got {v}")
    return v


def limits_from_args(args) -> Limits:
    """Limits from the parsed server options; the API key is read from the named variable here."""
    key = None
    if args.api_key_env:
        key = os.environ.get(args.api_key_env, "")
        if not key:
            raise AttnprobeError(f"--require-key-env {args.api_key_env}: that environment variable is not set or empty")
    for name in ("max_prompt_tokens", "max_body_bytes", "read_timeout", "request_timeout", "max_seconds",
                 "max_queue"):
        v = getattr(args, name)
        if v is not None and v <= 0:
            flag = {"request_timeout": "receive_timeout"}.get(name, name).replace("_", "-")
            raise AttnprobeError(f"--{flag} must be positive, got {v}")
    return Limits(max_prompt_tokens=args.max_prompt_tokens, max_body_bytes=args.max_body_bytes,
                  read_timeout=args.read_timeout, request_timeout=args.request_timeout, max_seconds=args.max_seconds, api_key=key,
                  max_queue=args.max_queue)


def main(argv: list[str] | None = None) -> int:
    """``python -m attnprobe.generation.server``: the same server as ``attnprobe serve`` (default port 0)."""
    p = argparse.ArgumentParser(prog="python -m attnprobe.generation.server",
                                description="Serve a transformers model on an OpenAI-compatible endpoint.")
    p.add_argument("--model", default="default", help="model spec (default: the bundled SmolLM2-135M-Instruct)")
    p.add_argument("--dtype", default="float32", type=canonical_dtype, choices=DTYPES)  # the one table, as `serve`
    p.add_argument("--device", default=None, help="torch device (default cpu)")
    add_server_options(p, default_port=0)
    args = p.parse_args(argv)
    for line in deprecation_warnings(args):
        print(f"{p.prog}: warning: {line}", file=sys.stderr)
    try:
        limits = limits_from_args(args)
    except AttnprobeError as exc:
        p.error(str(exc))
    try:
        return serve(args.model, dtype=args.dtype, device=args.device, host=args.host, port=args.port, limits=limits)
    except AttnprobeError as exc:  # a port in use, a model that is not there: one line, exit 2
        print(f"{p.prog}: error: {exc}", file=sys.stderr)
        return 2
