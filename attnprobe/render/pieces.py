"""Text tokenized in pieces, as a Search-R1 sequence was (:mod:`attnprobe.agents.searchr1`): its prompt, every
reply and every observation tokenized apart and concatenated, which the whole text tokenized at once need not
reproduce (a token may span two pieces). A message's ``pieces`` field lists where each piece of its content
starts (character offsets); the renderer then tokenizes the text up to that content, each piece, and the rest
apart, so a capture sees the ids the model was sent."""

from __future__ import annotations

import numpy as np

from attnprobe.trajectory.schema import message_text


def piece_cuts(parts, messages: list[dict]) -> list[int]:
    """Character offsets in the rendered text where a piece starts or the content ends, for every message with
    ``pieces`` whose content the template wrote unchanged (found at ``part.span``); none for the others."""
    cuts: list[int] = []
    for part in parts:
        msg = messages[part.message_index]
        starts = msg.get("pieces")
        if part.name != "content" or not starts or part.span is None:
            continue
        content = message_text(msg.get("content"))
        s, e = part.span
        if e - s != len(content) or not all(isinstance(c, int) and 0 <= c <= len(content) for c in starts):
            continue
        cuts += [s + c for c in starts] + [e]
    return cuts


def encode(tokenizer, text: str, cuts: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """(ids, offsets) of ``text`` tokenized between consecutive ``cuts`` (whole when there are none)."""
    bounds = [0, *sorted({c for c in cuts if 0 < c < len(text)}), len(text)]
    ids: list[int] = []
    offsets: list[tuple[int, int]] = []
    for a, b in zip(bounds, bounds[1:]):
        enc = tokenizer(text[a:b], add_special_tokens=False, return_offsets_mapping=True)
        ids += list(enc["input_ids"])
        offsets += [(x + a, y + a) for x, y in enc["offset_mapping"]]
    return np.asarray(ids, dtype=np.int64), np.asarray(offsets, dtype=np.int64).reshape(-1, 2)
