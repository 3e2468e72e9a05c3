"""Progress bars: :func:`progress_bar`, the bar every executor and loop opens, and :func:`plain_bar`, the tqdm
options for a bar drawn where no terminal reads it (also used by the capture backends' prefill and GGUF bars)."""

from __future__ import annotations

import sys


def plain_bar(stream=None) -> dict:
    """tqdm options for a stream that is not a terminal (a log file, a pipe): ASCII blocks and every bar at
    position 0, so no escape codes reach the log (nested bars otherwise move the cursor up with ``ESC[A``);
    on a terminal, none (tqdm draws as usual)."""
    stream = sys.stderr if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    try:
        tty = bool(isatty()) if isatty else False
    except (OSError, ValueError):  # a closed stream
        tty = False
    return {} if tty else {"ascii": True, "position": 0}


def progress_bar(**kw):
    """A tqdm bar as every attnprobe loop opens it: not on a terminal, ASCII at position 0, so a log holds
    no escape codes (:func:`plain_bar`)."""
    from tqdm.auto import tqdm

    return tqdm(**{**plain_bar(kw.get("file")), **kw})
