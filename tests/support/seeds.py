"""The seed papers' text (../shared/seeds/ next to the checkout), for tests that compare our
constants with what a seed prints."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from support.paths import ROOT


def seeds_dir() -> Path | None:
    """The first ``shared/seeds`` folder beside the checkout or one of its parents (a git worktree
    sits one level deeper than the main checkout)."""
    for parent in ROOT.parents:
        cand = parent / "shared" / "seeds"
        if cand.is_dir():
            return cand
    return None


def seed_text(number: str) -> str:
    """The text of seed ``number`` (e.g. "001"); skips the test, saying why, when the seeds are absent."""
    folder = seeds_dir()
    if folder is None:
        pytest.skip(f"the seed papers are not beside this checkout (no shared/seeds above {ROOT})")
    files = sorted(folder.glob(f"{number}_*.txt"))
    if not files:
        pytest.skip(f"seed {number} is not in {folder}")
    return files[0].read_text(encoding="utf-8")


def appendix_e_listings() -> dict[str, str]:
    """Seed 001 appendix E: the message listing of each mode ("observer", "agentic"), as printed."""
    text = seed_text("001")
    listings = [ln for ln in text.splitlines() if ln.lstrip("⬇ ").startswith("messages = [")]
    out = {}
    for ln in listings:
        if "Here are some search results that may help you" in ln:
            out["observer"] = ln
        elif "Call id:" in ln and "Calling tools" in ln:
            out["agentic"] = ln
    assert set(out) == {"observer", "agentic"}, f"appendix E listings not found in seed 001 ({len(listings)} lines)"
    return out


def listing_reminder(listing: str) -> str:
    """The one <system-reminder>...</system-reminder> text of a listing."""
    found = re.findall(r"<system-reminder>.*?</system-reminder>", listing)
    assert len(found) == 1, found
    return found[0]
