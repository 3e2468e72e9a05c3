"""Start ``attnprobe serve`` without any command line: load the model, bind the port (a port in use is
one line naming host and port), print the readiness line, serve until SIGTERM/SIGINT."""

from __future__ import annotations

import errno
import ipaddress
import json
import signal
import sys
import threading

from attnprobe.errors import AttnprobeError
from attnprobe.generation.server.http import make_server
from attnprobe.generation.server.protocol import Limits

READY_EVENT = "listening"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: it may resolve anywhere


def check_port_free(host: str, port: int) -> None:
    """Bind ``host:port`` and let it go, so a port in use or an address that is not ours is refused in one
    line before the model loads. Port 0 (any free port) always passes."""
    import socket

    if port == 0:
        return
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise AttnprobeError(f"--host {host}: cannot resolve ({exc.strerror})") from None
    family, kind, proto, _, addr = infos[0]
    with socket.socket(family, kind, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as http.server does: TIME_WAIT is no conflict
        try:
            s.bind(addr)
        except OSError as exc:
            raise bind_error(host, port, exc) from None


def bind_error(host: str, port: int, exc: OSError) -> AttnprobeError:
    """One line for a failed bind, naming host and port."""
    if exc.errno == errno.EADDRINUSE:
        return AttnprobeError(f"{host}:{port}: address already in use (another server is listening there; "
                              "choose another --port, or --port 0 for any free one)")
    if exc.errno == errno.EACCES:
        return AttnprobeError(f"{host}:{port}: permission denied (ports below 1024 need privileges)")
    if exc.errno == errno.EADDRNOTAVAIL:
        return AttnprobeError(f"{host}:{port}: cannot assign the address (--host is not an address of this machine)")
    return AttnprobeError(f"{host}:{port}: cannot listen ({exc.strerror or exc})")


def serve(model_spec: str = "default", *, dtype: str = "float32", host: str = "127.0.0.1", port: int = 0,
          announce: bool = True, device: str | None = None, limits: Limits | None = None) -> int:
    """Load ``model_spec`` (``dtype``, ``device``), bind ``host:port`` (0 = any free port), print the readiness line (when
    ``announce``) and serve until SIGTERM/SIGINT; returns 0 after a clean shutdown."""
    from attnprobe.capture.models import load_model

    limits = limits or Limits()
    check_port_free(host, port)  # before the model loads
    loaded = load_model(model_spec, dtype=dtype, device=device)
    try:
        server = make_server(loaded, host=host, port=port, limits=limits)
    except OSError as exc:  # taken while the model loaded
        raise bind_error(host, port, exc) from None
    bound_host, bound_port = server.server_address[:2]
    stopping = threading.Event()

    def _stop(signum, frame):  # serve_forever runs in this thread: shut it down from another one
        if not stopping.is_set():
            stopping.set()
            threading.Thread(target=server.shutdown, daemon=True).start()

    previous = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous[sig] = signal.signal(sig, _stop)
    try:
        if not is_loopback(host):
            print(f"attnprobe serve: WARNING: listening on {host}, beyond this machine; plain HTTP, "
                  + ("bearer token required (--require-key-env)" if limits.api_key else
                     "NO authentication: anyone who reaches the port can use the model (set --require-key-env)"),
                  file=sys.stderr, flush=True)
        if announce:
            print(json.dumps({"event": READY_EVENT, "url": f"http://{bound_host}:{bound_port}/v1",
                              "model": loaded.name}), flush=True)
        server.serve_forever(poll_interval=0.2)
    finally:
        server.server_close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0
