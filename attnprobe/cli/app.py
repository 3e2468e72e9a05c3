"""``attnprobe app --data DIR``: start the Streamlit explorer on saved outputs (no model needed)."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from attnprobe.cli.options import add_options, option, port_number
from attnprobe.errors import AttnprobeError

ENV_DATA = "ATTNPROBE_APP_DATA"


def app_entry() -> Path:
    """The Streamlit script of the installed package ``attnprobe_app``."""
    spec = importlib.util.find_spec("attnprobe_app")
    if spec is not None and spec.submodule_search_locations:
        for loc in spec.submodule_search_locations:
            p = Path(loc) / "streamlit_app.py"
            if p.is_file():
                return p
    raise AttnprobeError("the app is not installed (no attnprobe_app package): pip install 'attnprobe[app]'")


def build_command(data: Path, port: int, host: str, headless: bool = True) -> list[str]:
    return [sys.executable, "-m", "streamlit", "run", str(app_entry()),
            "--server.port", str(port), "--server.address", host,
            "--server.headless", "true" if headless else "false",
            "--browser.gatherUsageStats", "false", "--client.toolbarMode", "minimal",
            "--", "--data", str(data)]


def cmd_app(args) -> int:
    data = Path(args.data).expanduser()
    if not data.is_dir():
        raise AttnprobeError(f"--data {data}: not a folder")
    if importlib.util.find_spec("streamlit") is None:
        raise AttnprobeError("streamlit is not installed: pip install 'attnprobe[app]'")
    cmd = build_command(data.resolve(), args.port, args.host, headless=not args.open_browser)
    env = dict(os.environ, **{ENV_DATA: str(data.resolve())})
    if not args.print_command:
        from attnprobe.generation.server import check_port_free

        check_port_free(args.host, args.port)  # one line naming host and port, not Streamlit's traceback
    print(f"attnprobe app: http://{args.host}:{args.port}  (data: {data.resolve()}; Ctrl-C to stop)", file=sys.stderr)
    if args.print_command:
        print(" ".join(cmd))
        return 0
    return run_child(cmd, env)


def _die_with_parent() -> None:
    """In the child, before exec: ask Linux for SIGTERM when the parent dies (prctl PR_SET_PDEATHSIG)."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))


def run_child(cmd: list[str], env: dict, *, grace: float = 15.0) -> int:
    """Run the Streamlit server and stop it with us: SIGTERM, SIGINT and SIGHUP are forwarded to it
    (it runs in its own session, so a terminal's Ctrl-C reaches it once, through us) and it gets
    ``grace`` seconds to exit before SIGKILL. On Linux it also gets SIGTERM if we are killed outright
    (SIGKILL). Never leaves it running. Exit code: the child's, 130 after Ctrl-C."""
    proc = subprocess.Popen(cmd, env=env, start_new_session=True,
                            preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None)
    received: list[int] = []

    def forward(signum, frame):
        received.append(signum)
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signum)

    previous = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            previous[sig] = signal.signal(sig, forward)
    try:
        deadline = None
        while True:
            try:
                rc = proc.wait(timeout=0.5)
                break
            except subprocess.TimeoutExpired:
                if received and deadline is None:
                    deadline = time.monotonic() + grace
                if deadline is not None and time.monotonic() > deadline:
                    proc.kill()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if proc.poll() is None:  # an exception of our own: take the child with us
            proc.kill()
            proc.wait()
    return 130 if signal.SIGINT in received else rc


@dataclass(frozen=True)
class AppOptions:
    """The options of ``attnprobe app``, declared once."""

    data: Path = option(flag="--data", required=True, type=Path, help="data directory to explore (read only inside it)")
    port: int = option(8501, flag="--port", type=port_number, help="port (default {default})")
    host: str = option("127.0.0.1", flag="--host", help="address to listen on (default {default}: this machine only)")
    open_browser: bool = option(False, flag="--open-browser", action="store_true",
                                help="open a browser tab (default: headless server)")
    print_command: bool = option(False, flag="--print-command", action="store_true",
                                 help="print the streamlit command instead of running it")


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "app", help="browse captures, decay curves, IBIS framings, model comparisons, counterfactuals and studies "
                    "in a browser",
        description="Start the Streamlit app on a data directory holding outputs of 'capture' (and 'demo'), "
                    "'counterfactual', 'ibis', 'compare' and 'study interference' / 'study attention' (found "
                    "recursively), on six pages: Trajectory, Decay, Framings, Models, Counterfactual and Study. "
                    "It reads only inside that directory and needs no model.")
    add_options(p, AppOptions)
    p.set_defaults(func=cmd_app)
