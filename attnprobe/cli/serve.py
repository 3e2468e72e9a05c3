"""``attnprobe serve``: an OpenAI-compatible endpoint for a local transformers model."""

from __future__ import annotations

from attnprobe.cli.options import add_model_options


def cmd_serve(args) -> int:
    from attnprobe.generation.server import serve

    return serve(args.model, dtype=args.dtype, device=args.device, host=args.host, port=args.port)


def register(sub) -> None:
    p = sub.add_parser("serve", help="serve a transformers model on an OpenAI-compatible HTTP endpoint",
                       description="A small /v1/chat/completions server (loopback by default) for runs against "
                                   "the bundled model through the OpenAI-compatible code path. Prints one line "
                                   '{"event": "listening", "url": "http://HOST:PORT/v1", "model": NAME} once it '
                                   "accepts connections (--port 0 = any free port); SIGTERM/Ctrl-C stop it.")
    add_model_options(p)
    g = p.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1, loopback only)")
    g.add_argument("--port", type=int, default=8000, help="port (default 8000; 0 = any free port)")
    p.set_defaults(func=cmd_serve)
