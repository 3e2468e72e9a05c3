"""Bracket matching over JSON / Python-literal text, string-aware: one linear scan that serves the renderer
(finding a template-serialized tool call) and the tool-call parser (every bracket of a generated reply)."""

from __future__ import annotations


def bracket_end(text: str, start: int) -> int | None:
    """Index just past the bracketed JSON or Python literal opening at ``text[start]`` (string-aware
    for ' and "; brackets must nest); None if it does not close. Finds a template-serialized tool
    call (``render.rendering``) and a call in generated text (``generation.toolparse``)."""
    ends: dict[int, int | None] = {}
    bracket_ends(text, start, ends)
    return ends.get(start)


def bracket_ends(text: str, start: int, ends: dict[int, int | None]) -> None:
    """:func:`bracket_end` for ``text[start]`` and, from the same pass, for every bracket it opens outside a
    string (their scans from there would read the same characters), into ``ends``: a parser that asks for
    every bracket of a text stays linear (once per bracket was quadratic: 16 KB of ``[`` took 34 s)."""
    pairs = {"{": "}", "[": "]", "(": ")"}
    stack: list[tuple[str, int]] = []
    quote, esc = None, False
    for i in range(start, len(text)):
        ch = text[i]
        if quote:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch in pairs:
            stack.append((pairs[ch], i))
        elif ch in ")]}":
            if not stack or ch != stack[-1][0]:
                break  # a mismatch: every bracket still open fails here too
            ends[stack.pop()[1]] = i + 1
            if not stack:
                return
    for _, i in stack:
        ends[i] = None
