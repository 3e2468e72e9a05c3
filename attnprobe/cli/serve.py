"""``attnprobe serve``: an OpenAI-compatible endpoint for a local transformers model."""

from __future__ import annotations


def cmd_serve(args) -> int:
    from attnprobe.capture.models import load_model
    from attnprobe.generation.server import make_server

    server = make_server(load_model(args.model, dtype=args.dtype), args.host, args.port)
    host, port = server.server_address[:2]
    print(f"serving {args.model} on http://{host}:{port}/v1", flush=True)
    try:
        server.serve_forever()
    finally:
        server.server_close()
    return 0


def register(sub) -> None:
    p = sub.add_parser("serve", help="serve a transformers model on an OpenAI-compatible HTTP endpoint",
                       description="A small /v1/chat/completions server (loopback by default) for runs against "
                                   "the bundled model through the OpenAI-compatible code path.")
    p.add_argument("--model", default="default")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.set_defaults(func=cmd_serve)
