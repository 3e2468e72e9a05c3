"""Compare two ``scripts/compare_outputs.sh`` folders: each file byte-identical, or equal once what differs
between two runs of the same code is dropped (JSON keys of timings, dates, versions and hosts; the checkout's
absolute path; plotly's random div ids; study.md's seconds-per-call column), else its first differing lines.
Exit 1 when a file differs or exists on one side only."""

from __future__ import annotations

import difflib
import json
import re
import sys
from pathlib import Path

VOLATILE_KEY = re.compile(r"(second|_s$|^s$|time|elapsed|wall|date|created|started|finished|version|git|duration"
                          r"|host|pid|per_s|tokens_per|ms$)", re.I)
CHECKOUT = re.compile(r"/\S+?/(\.venv|trajectories|attnprobe)/")
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
DURATION = re.compile(r"\d+(\.\d+)?\s*(s|ms|min)\b")
SECONDS_CELL = re.compile(r"\| [0-9.]+ \[[0-9.]+, [0-9.]+\] \| (\d+) \|$")  # study.md: seconds per call, invalid


def _norm(obj, roots):
    if isinstance(obj, dict):
        return {k: _norm(v, roots) for k, v in obj.items() if not VOLATILE_KEY.search(k)}
    if isinstance(obj, list):
        return [_norm(v, roots) for v in obj]
    if isinstance(obj, str):
        for root in roots:
            obj = obj.replace(str(root), "OUT")
        return CHECKOUT.sub(r"CHECKOUT/\1/", obj)
    return obj


def _records(path: Path, roots):
    if path.suffix == ".json":
        return _norm(json.loads(path.read_text()), roots)
    if path.suffix in (".jsonl", ".ndjson"):
        return [_norm(json.loads(line), roots) for line in path.read_text().splitlines() if line.strip()]
    return None


def _lines(path: Path, roots) -> list[str]:
    text = path.read_text()
    for root in roots:
        text = text.replace(str(root), "OUT")
    text = UUID.sub("UUID", CHECKOUT.sub(r"CHECKOUT/\1/", text))
    return [SECONDS_CELL.sub(r"| T | \1 |", DURATION.sub("T", line)) for line in text.splitlines()]


def _files(root: Path) -> set[Path]:
    return {p.relative_to(root) for p in root.rglob("*")
            if p.is_file() and p.suffix != ".log" and p.name != ".attnprobe.lock"}


def main(before: Path, after: Path) -> int:
    roots = (before.resolve(), after.resolve(), before, after)
    fa, fb = _files(before), _files(after)
    same = normalised = 0
    differ: list[Path] = []
    for rel in sorted(fa & fb):
        a, b = before / rel, after / rel
        if a.read_bytes() == b.read_bytes():
            same += 1
            continue
        try:
            ra, rb = _records(a, roots), _records(b, roots)
            equal = ra is not None and ra == rb
            if ra is None and a.suffix in (".md", ".html", ".txt", ".csv"):
                equal = _lines(a, roots) == _lines(b, roots)
        except (UnicodeDecodeError, json.JSONDecodeError):
            equal = False
        if equal:
            normalised += 1
        else:
            differ.append(rel)
    print(f"{len(fa)} files before, {len(fb)} after; only before: {sorted(map(str, fa - fb))}; "
          f"only after: {sorted(map(str, fb - fa))}")
    print(f"byte-identical {same}; equal but for timings, versions and paths {normalised}; differ {len(differ)}")
    for rel in differ:
        print("differs:", rel)
        ra, rb = _records(before / rel, roots), _records(after / rel, roots)
        if ra is not None:
            la, lb = (json.dumps(r, indent=1, sort_keys=True).splitlines() for r in (ra, rb))
        else:
            la, lb = _lines(before / rel, roots), _lines(after / rel, roots)
        for line in list(difflib.unified_diff(la, lb, lineterm="", n=0))[2:12]:
            print("   ", line[:200])
    return 1 if differ or fa != fb else 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python scripts/compare_outputs.py OUT_BEFORE OUT_AFTER")
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2])))
