"""``attnprobe serve``: an OpenAI-compatible endpoint for a local transformers model."""

from __future__ import annotations

from attnprobe.cli.options import add_model_options


def cmd_serve(args) -> int:
    from attnprobe.generation.server import limits_from_args, serve

    return serve(args.model, dtype=args.dtype, device=args.device, host=args.host, port=args.port,
                 limits=limits_from_args(args))


def register(sub) -> None:
    from attnprobe.generation.server import add_server_options

    p = sub.add_parser("serve", help="serve a transformers model on an OpenAI-compatible HTTP endpoint",
                       description="A small /v1/chat/completions server (loopback by default) for runs against "
                                   "the bundled model through the OpenAI-compatible code path. Prints one line "
                                   '{"event": "listening", "url": "http://HOST:PORT/v1", "model": NAME} once it '
                                   "accepts connections (--port 0 = any free port); SIGTERM/Ctrl-C stop it. "
                                   "One generation at a time (others wait); no streaming (stream=true gets "
                                   "HTTP 400); prompts over --max-prompt-tokens and bodies over --max-body-bytes "
                                   "are refused; a generation stops when its client disconnects.")
    add_model_options(p)
    add_server_options(p, default_port=8000)
    p.set_defaults(func=cmd_serve)
