"""``attnprobe app --data DIR``: start the Streamlit explorer on saved outputs (no model needed)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

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
    print(f"attnprobe app: http://{args.host}:{args.port}  (data: {data.resolve()}; Ctrl-C to stop)", file=sys.stderr)
    if args.print_command:
        print(" ".join(cmd))
        return 0
    proc = subprocess.Popen(cmd, env=env)
    try:
        return proc.wait()
    except KeyboardInterrupt:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        raise


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "app", help="browse captures, decay curves, IBIS framings and model comparisons in a browser",
        description="Start the Streamlit app on a data directory holding outputs of 'capture', 'ibis' and "
                    "'compare' (found recursively). It reads only inside that directory and needs no model.")
    p.add_argument("--data", required=True, type=Path, help="data directory to explore (read only inside it)")
    p.add_argument("--port", type=int, default=8501, help="port (default 8501)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    p.add_argument("--open-browser", action="store_true", help="open a browser tab (default: headless server)")
    p.add_argument("--print-command", action="store_true", help="print the streamlit command instead of running it")
    p.set_defaults(func=cmd_app)
