"""Every file the project writes or reads back goes through here, split by concern:

- :mod:`attnprobe.io.atomic`: atomic file and folder writes, recovery after a killed writer;
- :mod:`attnprobe.io.json`: the one strict JSON / JSON Lines reader, the one appender, the line format;
- :mod:`attnprobe.io.fs`: writable outputs, regular-file inputs, injective names, fingerprints, output locks;
- :mod:`attnprobe.io.errlog`: ``errors.jsonl`` lines and the failures a run records and moves past;
- :mod:`attnprobe.io.bars`: the progress bar every executor opens.

(The work loop itself is an executor: :mod:`attnprobe.execution`.)

Every name is re-exported here: ``from attnprobe.io import X`` is the way to use them.
"""

from __future__ import annotations

import os  # noqa: F401  (tests patch attnprobe.io.os.fsync / .write: the process-wide functions)
import shutil  # noqa: F401

from attnprobe.io.atomic import (
    RENAME_EXCHANGE,
    AtomicDir,
    atomic_write_bytes,
    atomic_write_text,
    is_work_dir,
    naming,
    recover_atomic_dirs,
)
from attnprobe.io.bars import progress_bar
from attnprobe.io.errlog import ERRORS_FILE, EXPECTED_ERRORS, log_error
from attnprobe.io.fs import (
    FINGERPRINT_SAMPLE,
    LOCK_NAME,
    STALE_AFTER_S,
    NotRegularFile,
    OutputInUse,
    OutsideFolder,
    check_regular_file,
    content_hash,
    ensure_writable_dir,
    ensure_writable_file,
    file_kind,
    fingerprint,
    flocked,
    hold_dir_lock,
    hold_file_lock,
    hold_lock,
    inside,
    layout_path,
    read_regular_bytes,
    resolved_inside,
    safe_name,
    safetensors_problem,
    unique_names,
)
from attnprobe.io.json import (
    MAX_JSON_BYTES,
    MAX_JSON_DEPTH,
    append_jsonl,
    dumps_line,
    finite_json,
    json_depth_ok,
    load_json,
    loads_strict,
    located_error,
    parse_json,
    read_jsonl,
    read_records,
    repair_torn_tail,
    rewrite_jsonl,
    write_jsonl,
)

__all__ = [
    "AtomicDir", "EXPECTED_ERRORS", "FINGERPRINT_SAMPLE", "LOCK_NAME", "MAX_JSON_BYTES",
    "MAX_JSON_DEPTH", "NotRegularFile", "OutputInUse", "OutsideFolder", "RENAME_EXCHANGE", "STALE_AFTER_S", "append_jsonl",
    "atomic_write_bytes", "atomic_write_text", "check_regular_file", "content_hash", "dumps_line", "ensure_writable_dir",
    "ensure_writable_file", "file_kind", "fingerprint", "finite_json", "flocked", "hold_dir_lock",
    "ERRORS_FILE", "hold_file_lock", "hold_lock", "inside", "is_work_dir", "json_depth_ok", "layout_path", "load_json", "loads_strict",
    "located_error", "log_error", "naming", "parse_json", "read_jsonl", "read_records", "read_regular_bytes",
    "progress_bar", "recover_atomic_dirs", "repair_torn_tail", "resolved_inside", "rewrite_jsonl", "safe_name", "safetensors_problem", "unique_names", "write_jsonl",
]
