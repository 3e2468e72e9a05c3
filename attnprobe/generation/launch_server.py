"""Start an OpenAI-compatible server for a transformers model and print its address.

    python -m attnprobe.runner.launch_server [--model default] [--port 0]

Prints one line ``LISTENING http://127.0.0.1:<port>/v1`` once the model is loaded (port 0 = any free
port), then serves until killed. Used by the tests to exercise the runner's OpenAI backend against
a real server process.
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="default")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    args = ap.parse_args(argv)
    from attnprobe.capture.models import load_model
    from attnprobe.generation.server import make_server

    server = make_server(load_model(args.model), host=args.host, port=args.port)
    host, port = server.server_address[:2]
    print(f"LISTENING http://{host}:{port}/v1", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
