"""Launch :mod:`attnprobe.serve` (an OpenAI-compatible server for a local model) as its own process.

    python -m attnprobe.ibis.serve_main --model default --host 127.0.0.1 --port 0

Prints one JSON line ``{"event": "listening", "url": "http://127.0.0.1:PORT/v1", "model": ...}`` on
stdout once it accepts connections (port 0 picks a free port), then serves until SIGTERM/SIGINT.
Used by the tests to exercise the OpenAI-compatible path against a real server process.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m attnprobe.ibis.serve_main", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="default")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    args = p.parse_args(argv)
    from attnprobe.capture.models import load_model
    from attnprobe.generation.server import make_server

    loaded = load_model(args.model, dtype=args.dtype)
    server = make_server(loaded, host=args.host, port=args.port)
    host, port = server.server_address[:2]

    def _stop(signum, frame):
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    print(json.dumps({"event": "listening", "url": f"http://{host}:{port}/v1", "model": loaded.name}), flush=True)
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
